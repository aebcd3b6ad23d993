//! `count-shapes`: 1 when a completion's answer is the number of shapes of the colour its prompt
//! names, counted in the prompt's images, else 0.
//!
//! A verifier that reads the image instead of a reference answer: it asks the host for the
//! prompt's images (`READS_IMAGES`), finds the one colour the prompt names among its `colors`,
//! and counts the shapes of that colour — the 4-connected regions of pixels within `tolerance`
//! of it on every channel, of at least `min_pixels` pixels — over all the prompt's images.
//! Shapes that touch count as one, so boards must keep them apart (the generated shapes task
//! leaves a white margin around each square). The completion's answer is found as `math-answer`
//! finds it (`extract`). A prompt without images, or naming no colour or several, is "not
//! applicable".

use rein_pdk::answer::{Answer, Extraction, extract};
use rein_pdk::image::RgbPixels;
use rein_pdk::json::Value;
use rein_pdk::{Config, ConfigKey, Group, Image, Metadata, Reward, Score};

/// The colours known by default: the generated shapes task's.
const DEFAULT_COLORS: &str = r#"{"red": [220, 30, 30], "green": [30, 170, 60], "blue": [30, 60, 220], "yellow": [235, 200, 20], "black": [0, 0, 0]}"#;

/// The reward.
pub struct CountShapes {
    colors: Vec<(String, [u8; 3])>,
    tolerance: u8,
    min_pixels: usize,
    extraction: Extraction,
}

impl CountShapes {
    /// The colour the prompt names (as a whole word), when it names exactly one.
    fn asked(&self, prompt: &str) -> Option<[u8; 3]> {
        let words: Vec<String> = (prompt.split(|c: char| !c.is_alphanumeric()))
            .map(str::to_lowercase)
            .collect();
        let mut named = self.colors.iter().filter(|(name, _)| words.contains(name));
        match (named.next(), named.next()) {
            (Some((_, rgb)), None) => Some(*rgb),
            _ => None,
        }
    }

    /// How many shapes of `rgb` `pixels` holds.
    pub fn count(&self, pixels: &RgbPixels, rgb: [u8; 3]) -> usize {
        let (width, height) = (pixels.width as usize, pixels.height as usize);
        let matches = |at: usize| {
            let p = &pixels.rgb[at * 3..at * 3 + 3];
            (0..3).all(|c| p[c].abs_diff(rgb[c]) <= self.tolerance)
        };
        let mut seen = vec![false; width * height];
        let mut stack = Vec::new();
        let mut shapes = 0;
        for start in 0..width * height {
            if seen[start] || !matches(start) {
                continue;
            }
            seen[start] = true;
            stack.push(start);
            let mut size = 0;
            while let Some(at) = stack.pop() {
                size += 1;
                let (x, y) = (at % width, at / width);
                let neighbours = [
                    (x > 0).then(|| at - 1),
                    (x + 1 < width).then(|| at + 1),
                    (y > 0).then(|| at - width),
                    (y + 1 < height).then(|| at + width),
                ];
                for next in neighbours.into_iter().flatten() {
                    if !seen[next] && matches(next) {
                        seen[next] = true;
                        stack.push(next);
                    }
                }
            }
            if size >= self.min_pixels {
                shapes += 1;
            }
        }
        shapes
    }

    /// The number of shapes of `rgb` in `images`; an error names the image that cannot be read.
    fn count_in(&self, images: &[Image], rgb: [u8; 3]) -> Result<usize, String> {
        let mut total = 0;
        for (i, image) in images.iter().enumerate() {
            let pixels = image.decode_rgb().map_err(|e| format!("image {i}: {e}"))?;
            total += self.count(&pixels, rgb);
        }
        Ok(total)
    }
}

/// `colors` from the config: an object of names and `[r, g, b]` values.
fn parse_colors(value: &Value) -> Result<Vec<(String, [u8; 3])>, String> {
    let Value::Object(map) = value else {
        return Err("`colors` must be an object of names and [r, g, b] values".into());
    };
    (map.iter())
        .map(|(name, rgb)| {
            let channels: Option<Vec<u8>> = (rgb.as_array()).filter(|a| a.len() == 3).and_then(|a| {
                a.iter()
                    .map(|c| c.as_u64().and_then(|c| u8::try_from(c).ok()))
                    .collect()
            });
            match channels {
                Some(c) => Ok((name.to_lowercase(), [c[0], c[1], c[2]])),
                None => Err(format!("`colors.{name}` must be [r, g, b], each 0 to 255")),
            }
        })
        .collect()
}

impl Reward for CountShapes {
    const METADATA: Metadata = Metadata::new(
        "count-shapes",
        "1 when the completion's answer is the number of shapes of the prompt's colour in the prompt's images, else 0",
    )
    .config(&[
        ConfigKey::new(
            "colors",
            "the colours a prompt may name: an object of names and [r, g, b]",
        )
        .default(DEFAULT_COLORS),
        ConfigKey::new(
            "tolerance",
            "how far a pixel may be from the colour on each channel, 0 to 255",
        )
        .default("48"),
        ConfigKey::new(
            "min_pixels",
            "the fewest pixels a shape has (smaller regions are noise)",
        )
        .default("4"),
        ConfigKey::new(
            "extract",
            "where the completion's answer is: auto, boxed, hashes, answer, last-number or tag:NAME",
        )
        .default("\"auto\""),
    ]);

    const READS_IMAGES: bool = true;

    fn new(config: &Config) -> Result<Self, String> {
        let default: Value = rein_pdk::json::from_str(DEFAULT_COLORS).map_err(|e| e.to_string())?;
        let colors = parse_colors(config.get("colors").unwrap_or(&default))?;
        let tolerance = config.u64_or("tolerance", 48)?;
        Ok(Self {
            colors,
            tolerance: u8::try_from(tolerance).map_err(|_| format!("`tolerance` is {tolerance}, over 255"))?,
            min_pixels: config.u64_or("min_pixels", 4)? as usize,
            extraction: Extraction::parse(config.str_or("extract", "auto")?)?,
        })
    }

    fn score(&mut self, group: &Group) -> Result<Vec<Score>, String> {
        let asked = self.asked(&group.prompt).filter(|_| !group.images.is_empty());
        let Some(rgb) = asked else {
            return Ok(vec![Score::not_applicable(); group.completions.len()]);
        };
        let count = Answer::new(&self.count_in(&group.images, rgb)?.to_string());
        Ok((group.completions.iter())
            .map(|c| match extract(c, &self.extraction) {
                Some(answer) => Score::from(Answer::new(answer).matches(&count, 0.0)).with("answered", 1.0),
                None => Score::new(0.0).with("answered", 0.0),
            })
            .collect())
    }
}

rein_pdk::export_reward!(CountShapes);

#[cfg(test)]
mod tests {
    use super::*;

    fn reward(config: &str) -> CountShapes {
        CountShapes::new(&Config::parse(config, &CountShapes::METADATA).unwrap()).unwrap()
    }

    /// A white `side × side` board with `squares` (x, y, size, colour) drawn on it.
    fn board(side: u32, squares: &[(u32, u32, u32, [u8; 3])]) -> RgbPixels {
        let mut rgb = vec![255; (side * side * 3) as usize];
        for &(x0, y0, size, colour) in squares {
            for y in y0..y0 + size {
                for x in x0..x0 + size {
                    let at = ((y * side + x) * 3) as usize;
                    rgb[at..at + 3].copy_from_slice(&colour);
                }
            }
        }
        RgbPixels {
            width: side,
            height: side,
            rgb,
        }
    }

    const RED: [u8; 3] = [220, 30, 30];
    const BLUE: [u8; 3] = [30, 60, 220];

    #[test]
    fn separate_regions_of_the_colour_are_counted() {
        let pixels = board(
            20,
            &[
                (1, 1, 4, RED),
                (7, 1, 4, RED),
                (1, 7, 4, BLUE),
                (13, 13, 4, [200, 50, 10]),
                (18, 1, 1, RED),
            ],
        );
        let reward = reward("{}");
        // Two red squares, one near-red within the tolerance; the single red pixel is noise.
        assert_eq!(reward.count(&pixels, RED), 3);
        assert_eq!(reward.count(&pixels, BLUE), 1);
        assert_eq!(self::reward(r#"{"tolerance": 0}"#).count(&pixels, RED), 2);
        assert_eq!(self::reward(r#"{"min_pixels": 1}"#).count(&pixels, RED), 4);
    }

    #[test]
    fn the_answer_is_checked_against_the_image() {
        let image = Image::png_from_rgb(&board(12, &[(1, 1, 4, RED), (7, 7, 4, RED), (1, 7, 4, BLUE)])).unwrap();
        let group = Group {
            prompt: "How many red squares are there?<image>".into(),
            completions: vec!["<answer>2</answer>".into(), "<answer>3</answer>".into(), "two".into()],
            images: vec![image.clone()],
            ..Group::default()
        };
        let scores: Vec<_> = (reward("{}").score(&group).unwrap().into_iter())
            .map(|s| s.value)
            .collect();
        assert_eq!(scores, [Some(1.0), Some(0.0), Some(0.0)]);
        for prompt in ["How many squares?", "Red or blue: how many?"] {
            let unclear = Group {
                prompt: prompt.into(),
                ..group.clone()
            };
            let scores = reward("{}").score(&unclear).unwrap();
            assert!(scores.iter().all(|s| s.value.is_none()), "{prompt}");
        }
        let without = Group {
            images: Vec::new(),
            ..group
        };
        assert!(reward("{}").score(&without).unwrap().iter().all(|s| s.value.is_none()));
    }

    #[test]
    fn bad_config_and_bad_images_are_errors() {
        let config = |text| Config::parse(text, &CountShapes::METADATA).unwrap();
        for bad in [
            r#"{"colors": {"red": [300, 0, 0]}}"#,
            r#"{"colors": [1]}"#,
            r#"{"tolerance": 256}"#,
        ] {
            assert!(CountShapes::new(&config(bad)).is_err(), "{bad}");
        }
        let group = Group {
            prompt: "How many red squares?".into(),
            completions: vec!["1".into()],
            images: vec![Image::png(b"\x89PNG\r\n\x1a\nbroken".to_vec())],
            ..Group::default()
        };
        let error = reward("{}").score(&group).unwrap_err();
        assert!(error.starts_with("image 0: "), "{error}");
    }
}

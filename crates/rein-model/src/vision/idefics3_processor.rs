//! Idefics3's (and SmolVLM's) image processor and prompt expansion, as transformers'
//! `Idefics3ImageProcessorPil` and `Idefics3Processor` define them.
//!
//! An image is resized so that its longest edge is `size.longest_edge`, then up to the next
//! multiples of the tile size (`max_image_size.longest_edge`) and cut into `rows × cols` tiles,
//! followed by the whole image resized to one tile (the global view); an image already no larger
//! than a tile is one tile. Samples are rescaled and normalised per channel. In the prompt each
//! `<image>` becomes, per tile, `<fake_token_around_image><row_r_col_c>` and `image_seq_len`
//! `<image>` tokens (a newline after each row of tiles), then the global view's
//! `\n<fake_token_around_image><global-img>`, its image tokens and a closing
//! `<fake_token_around_image>`.

use std::borrow::Borrow;
use std::path::Path;

use serde_json::Value;

use super::image_tokens::expand_markers;
use super::processor_settings::{SampleValues, Settings, processor_settings};
use super::resample::{Filter, Pixels};
use crate::lm::LoadError;
use crate::lm::json_file::read_json;

/// transformers' `MAX_IMAGE_SIZE`: no resized edge exceeds it.
const MAX_EDGE: usize = 4096;

/// The image token; each expands to the tiles' features.
pub const IMAGE_TOKEN: &str = "<image>";
const FAKE_TOKEN: &str = "<fake_token_around_image>";
const GLOBAL_TAG: &str = "<global-img>";

/// The settings of `preprocessor_config.json` (or `processor_config.json`'s `image_processor`).
#[derive(Debug, Clone, PartialEq)]
pub struct Idefics3Processor {
    convert_rgb: bool,
    /// The longest edge the image is first resized to, if any.
    resize_longest_edge: Option<usize>,
    filter: Filter,
    samples: SampleValues,
    splitting: bool,
    /// The tile's edge.
    tile: usize,
    /// Image tokens per tile.
    image_seq_len: usize,
}

/// One image as the model reads it: its tiles' pixel values and the grid they were cut from.
#[derive(Debug, Clone, PartialEq)]
pub struct Idefics3Image {
    /// `[tiles, 3, tile, tile]`, channels first.
    pub pixel_values: Vec<f32>,
    /// How many tiles: `rows × cols` plus the global view, or 1 when not split.
    pub tiles: usize,
    /// Rows of tiles before the global view (0 when not split).
    pub rows: usize,
    /// Columns of tiles before the global view (0 when not split).
    pub cols: usize,
    /// The side of a tile in pixels.
    pub side: usize,
}

impl Idefics3Image {
    /// The pixel values of `images` (of one tile size), tile after tile, as one tensor.
    ///
    /// # Panics
    /// When the images' tiles differ in size.
    ///
    /// # Shapes
    /// → `[Σ tiles, 3, side, side]`
    pub fn stack<'a, B: burn::tensor::backend::Backend>(
        images: impl IntoIterator<Item = &'a Idefics3Image>,
        device: &B::Device,
    ) -> burn::tensor::Tensor<B, 4> {
        let (mut tiles, mut side, mut values) = (0, None, Vec::new());
        for image in images {
            assert!(side.is_none_or(|s| s == image.side), "tiles of one size");
            (tiles, side) = (tiles + image.tiles, Some(image.side));
            values.extend_from_slice(&image.pixel_values);
        }
        let side = side.unwrap_or(0);
        burn::tensor::Tensor::from_data(burn::tensor::TensorData::new(values, [tiles, 3, side, side]), device)
    }
}

impl Idefics3Processor {
    /// The processor of the model directory `dir`, `image_seq_len` image tokens per tile.
    ///
    /// `processor_config.json`'s `image_seq_len`, when it has one, must be the model's: the prompt
    /// would otherwise hold a different number of image tokens than the encoder gives features.
    pub fn load(dir: &Path, image_seq_len: usize) -> Result<Self, LoadError> {
        let processor_path = dir.join("processor_config.json");
        let processor = (processor_path.is_file())
            .then(|| read_json(&processor_path))
            .transpose()?;
        let declared = processor.as_ref().and_then(|p| p["image_seq_len"].as_u64());
        if let Some(declared) = declared.filter(|&n| n != image_seq_len as u64) {
            return Err(LoadError::Json {
                path: processor_path,
                reason: format!("`image_seq_len` is {declared}, but the model gives {image_seq_len} features per tile"),
            });
        }
        let (path, settings) = processor_settings(dir, processor)?;
        Self::from_json(&settings, image_seq_len).map_err(|reason| LoadError::Json { path, reason })
    }

    /// The processor `settings` describe (a `preprocessor_config.json` object).
    pub fn from_json(settings: &Value, image_seq_len: usize) -> Result<Self, String> {
        let s = Settings(settings);
        s.expect_class("Idefics3ImageProcessor", "an Idefics3 image processor")?;
        let edge = |key: &str| -> Result<Option<usize>, String> {
            match &settings[key] {
                Value::Null => Ok(None),
                v => match v["longest_edge"].as_u64() {
                    Some(edge) if (1..=MAX_EDGE as u64).contains(&edge) => Ok(Some(edge as usize)),
                    _ => Err(format!(
                        "`{key}`: expected {{\"longest_edge\": 1..={MAX_EDGE}}}, found {v}"
                    )),
                },
            }
        };
        let tile = edge("max_image_size")?.unwrap_or(364);
        Ok(Self {
            convert_rgb: s.flag("do_convert_rgb", true),
            resize_longest_edge: match s.flag("do_resize", true) {
                true => Some(edge("size")?.unwrap_or(4 * 364)),
                false => None,
            },
            filter: s.filter(1)?,
            samples: s.sample_values([0.5; 3], [0.5; 3])?,
            splitting: s.flag("do_image_splitting", true),
            tile,
            image_seq_len,
        })
    }

    /// The same processor, splitting images into tiles or not.
    pub fn with_splitting(mut self, splitting: bool) -> Self {
        self.splitting = splitting;
        self
    }

    /// The tile's edge in pixels.
    pub fn tile(&self) -> usize {
        self.tile
    }

    /// Whether images other than RGB are laid over white first (`do_convert_rgb`).
    pub fn converts_to_rgb(&self) -> bool {
        self.convert_rgb
    }

    /// The pixel values of `image` (8-bit RGB).
    pub fn process(&self, image: &Pixels) -> Idefics3Image {
        let mut image = image.clone();
        if let Some(edge) = self.resize_longest_edge {
            let (height, width) = longest_edge_size(image.height, image.width, edge);
            image = image.resize(width, height, self.filter);
        }
        let (frames, rows, cols) = match self.splitting {
            true => {
                let (height, width) = tile_multiple_size(image.height, image.width, self.tile);
                self.split(image.resize(width, height, self.filter))
            }
            false => (vec![image.resize(self.tile, self.tile, self.filter)], 0, 0),
        };
        let mut pixel_values = Vec::with_capacity(frames.len() * 3 * self.tile * self.tile);
        for frame in &frames {
            for channel in 0..3 {
                pixel_values.extend(
                    frame.data[channel..]
                        .iter()
                        .step_by(3)
                        .map(|&v| self.samples.value(v, channel)),
                );
            }
        }
        Idefics3Image {
            pixel_values,
            tiles: frames.len(),
            rows,
            cols,
            side: self.tile,
        }
    }

    /// The tiles of `image` (whose sides are non-zero multiples of the tile) and the global view.
    fn split(&self, image: Pixels) -> (Vec<Pixels>, usize, usize) {
        let t = self.tile;
        if image.height <= t && image.width <= t {
            return (vec![image], 0, 0);
        }
        let (rows, cols) = (image.height / t, image.width / t);
        let mut frames: Vec<Pixels> = (0..rows)
            .flat_map(|r| (0..cols).map(move |c| (r, c)))
            .map(|(r, c)| image.crop(c * t, r * t, t, t))
            .collect();
        frames.push(image.resize(t, t, self.filter));
        (frames, rows, cols)
    }

    /// What one `<image>` of the prompt becomes for an image cut into `rows × cols` tiles.
    pub fn image_prompt(&self, rows: usize, cols: usize) -> String {
        let image_tokens = IMAGE_TOKEN.repeat(self.image_seq_len);
        let global = format!("{FAKE_TOKEN}{GLOBAL_TAG}{image_tokens}{FAKE_TOKEN}");
        if rows == 0 && cols == 0 {
            return global;
        }
        let mut text = String::new();
        for r in 1..=rows {
            for c in 1..=cols {
                text += &format!("{FAKE_TOKEN}<row_{r}_col_{c}>{image_tokens}");
            }
            text.push('\n');
        }
        text + "\n" + &global
    }

    /// `text` with its `<image>` markers expanded for `images`, in order.
    pub fn expand_prompt(&self, text: &str, images: &[impl Borrow<Idefics3Image>]) -> Result<String, String> {
        expand_markers(text, IMAGE_TOKEN, images, |image| {
            self.image_prompt(image.borrow().rows, image.borrow().cols)
        })
    }
}

/// `_resize_output_size_rescale_to_max_len` then `_resize_output_size_scale_below_upper_bound`:
/// the longest edge to `edge`, the other by the aspect ratio (truncated, then rounded up to even).
fn longest_edge_size(height: usize, width: usize, edge: usize) -> (usize, usize) {
    let aspect = width as f64 / height as f64;
    let (mut h, mut w) = match width >= height {
        true => {
            let h = (edge as f64 / aspect) as usize;
            (h + h % 2, edge)
        }
        false => {
            let w = (edge as f64 * aspect) as usize;
            (edge, w + w % 2)
        }
    };
    (h, w) = (h.max(1), w.max(1));
    let aspect = w as f64 / h as f64;
    if w >= h && w > MAX_EDGE {
        (h, w) = ((MAX_EDGE as f64 / aspect) as usize, MAX_EDGE);
    } else if h > w && h > MAX_EDGE {
        (h, w) = (MAX_EDGE, (MAX_EDGE as f64 * aspect) as usize);
    }
    (h.max(1), w.max(1))
}

/// `resize_for_vision_encoder`: both sides up to multiples of `tile`, the aspect ratio kept.
fn tile_multiple_size(height: usize, width: usize, tile: usize) -> (usize, usize) {
    let aspect = width as f64 / height as f64;
    let up = |v: usize| v.max(1).div_ceil(tile) * tile;
    match width >= height {
        true => {
            let w = up(width);
            (up((w as f64 / aspect) as usize), w)
        }
        false => {
            let h = up(height);
            (h, up((h as f64 * aspect) as usize))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn processor(splitting: bool) -> Idefics3Processor {
        let settings = serde_json::json!({
            "size": {"longest_edge": 48}, "max_image_size": {"longest_edge": 16},
            "do_image_splitting": splitting, "resample": 1,
        });
        Idefics3Processor::from_json(&settings, 4).unwrap()
    }

    #[test]
    fn sizes_follow_transformers() {
        // 40 wide, 25 high: 48 x int(48 / 1.6) = 30, then multiples of 16: 48 x 32.
        assert_eq!(longest_edge_size(25, 40, 48), (30, 48));
        assert_eq!(tile_multiple_size(30, 48, 16), (32, 48));
        // Odd results round up to even.
        assert_eq!(longest_edge_size(31, 50, 48), (30, 48));
        assert_eq!(longest_edge_size(50, 31, 48), (48, 30));
        // A very wide image: no edge above 4096, none below 1, and no tile row of 0 pixels.
        assert_eq!(longest_edge_size(1, 10_000, 8000), (1, 4096));
        assert_eq!(tile_multiple_size(1, 4096, 16), (16, 4096));
    }

    #[test]
    fn an_image_becomes_its_tiles_and_a_global_view() {
        let image = Pixels {
            width: 40,
            height: 25,
            channels: 3,
            data: vec![255; 40 * 25 * 3],
        };
        let out = processor(true).process(&image);
        assert_eq!((out.rows, out.cols, out.tiles), (2, 3, 7));
        assert_eq!(out.pixel_values.len(), 7 * 3 * 16 * 16);
        assert!(out.pixel_values.iter().all(|&v| v == 1.0), "white is (1 - 0.5) / 0.5");
        let single = processor(false).process(&image);
        assert_eq!((single.rows, single.cols, single.tiles), (0, 0, 1));
    }

    #[test]
    fn the_prompt_has_one_marker_per_image() {
        let p = processor(true);
        let image = Idefics3Image {
            pixel_values: vec![],
            tiles: 3,
            rows: 1,
            cols: 2,
            side: 16,
        };
        let text = p.expand_prompt("a<image>b", std::slice::from_ref(&image)).unwrap();
        let four = "<image>".repeat(4);
        assert_eq!(
            text,
            format!(
                "a<fake_token_around_image><row_1_col_1>{four}<fake_token_around_image><row_1_col_2>{four}\n\n\
                 <fake_token_around_image><global-img>{four}<fake_token_around_image>b"
            )
        );
        assert!(
            p.expand_prompt("no marker", &[image])
                .unwrap_err()
                .contains("0 `<image>` markers for 1 images")
        );
    }

    #[test]
    fn a_processor_declaring_another_image_seq_len_than_the_model_is_refused() {
        let dir = std::env::temp_dir().join(format!("rein-idefics3-processor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = serde_json::json!({"image_seq_len": 64, "image_processor": {"resample": 1}});
        std::fs::write(dir.join("processor_config.json"), config.to_string()).unwrap();
        let error = Idefics3Processor::load(&dir, 16).unwrap_err().to_string();
        assert!(
            error.contains("processor_config.json") && error.contains("`image_seq_len` is 64"),
            "{error}"
        );
        assert!(Idefics3Processor::load(&dir, 64).is_ok());
    }

    #[test]
    fn settings_rein_cannot_follow_are_refused_by_name() {
        let refuse = |settings: Value| Idefics3Processor::from_json(&settings, 4).unwrap_err();
        assert!(refuse(serde_json::json!({"resample": 0})).contains("`resample`"));
        assert!(refuse(serde_json::json!({"size": {"height": 3}})).contains("`size`"));
        assert!(refuse(serde_json::json!({"image_std": [1, 0, 1]})).contains("`image_std`"));
        assert!(
            refuse(serde_json::json!({"image_processor_type": "SiglipImageProcessor"}))
                .contains("SiglipImageProcessor")
        );
    }
}

//! Qwen2-VL's (and Qwen2.5-VL's) image processor and prompt expansion, as transformers'
//! `Qwen2VLImageProcessorPil` and `Qwen2VLProcessor` define them.
//!
//! An image is resized (`smart_resize`) so that both sides are multiples of `patch_size ×
//! merge_size` and its area lies within `[min_pixels, max_pixels]`, the aspect ratio kept as
//! closely as that allows; its samples are rescaled and normalised per channel, and it is cut
//! into `patch_size`-pixel patches, listed `merge_size × merge_size` block by block (the order
//! the vision tower's merger groups them in), each patch repeated `temporal_patch_size` times (a
//! still image is a video of identical frames). In the prompt each image's `<|image_pad|>`
//! becomes one `<|image_pad|>` per merged patch: `grid_h × grid_w / merge_size²`.

use std::borrow::Borrow;
use std::path::Path;

use serde_json::Value;

use super::image_tokens::expand_markers;
use super::processor_settings::{SampleValues, Settings, processor_settings};
use super::resample::{Filter, Pixels};
use crate::lm::LoadError;

/// The image token the chat template writes once per image, between `<|vision_start|>` and
/// `<|vision_end|>`; each expands to the image's merged patches.
pub const QWEN2_VL_IMAGE_TOKEN: &str = "<|image_pad|>";

/// Around each image's tokens in the prompt.
const VISION_START: &str = "<|vision_start|>";
const VISION_END: &str = "<|vision_end|>";

/// OpenAI CLIP's per-channel mean and standard deviation, Qwen2-VL's defaults.
const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_6, 0.275_777_1];

/// The most an image's longer side may exceed its shorter one (transformers refuses more).
const MAX_ASPECT_RATIO: f64 = 200.0;

/// The most pixels a processed image may have (`max_pixels`, or an image not resized): a
/// 4096 × 4096 image, whose patches (two frames) take 400 MB; the largest settings the released
/// models use are under it (Qwen2.5-VL: 12,845,056).
const MAX_PIXELS: usize = 4096 * 4096;

/// The settings of a Qwen2-VL `preprocessor_config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2VlProcessor {
    convert_rgb: bool,
    /// `(min_pixels, max_pixels)` of `smart_resize`, when resizing.
    resize: Option<(usize, usize)>,
    filter: Filter,
    samples: SampleValues,
    patch_size: usize,
    temporal_patch_size: usize,
    merge_size: usize,
}

/// One image as Qwen2-VL's vision tower reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2VlImage {
    /// `[grid_h × grid_w, 3 × temporal_patch_size × patch_size²]`: one row per patch, merge
    /// blocks in order, each row channel by channel, frame by frame, row by row.
    pub patches: Vec<f32>,
    /// `(grid_t, grid_h, grid_w)`: frames (1 for an image) and patches down and across.
    pub grid: (usize, usize, usize),
}

impl Qwen2VlProcessor {
    /// The processor of the model directory `dir` (`preprocessor_config.json`, or
    /// `processor_config.json`'s `image_processor`).
    pub fn load(dir: &Path) -> Result<Self, LoadError> {
        let (path, settings) = processor_settings(dir, None)?;
        Self::from_json(&settings).map_err(|reason| LoadError::Json { path, reason })
    }

    /// The processor `settings` describe (a `preprocessor_config.json` object).
    pub fn from_json(settings: &Value) -> Result<Self, String> {
        let s = Settings(settings);
        s.expect_class("Qwen2VLImageProcessor", "a Qwen2-VL image processor")?;
        // A positive integer up to `max` (bounded before anything is sized by it).
        let bounded = |key: &str, value: &Value, max: usize| -> Result<usize, String> {
            (value.as_u64())
                .filter(|&n| (1..=max as u64).contains(&n))
                .map(|n| n as usize)
                .ok_or_else(|| format!("`{key}`: expected an integer from 1 to {max}, found {value}"))
        };
        let size = |key: &str, default: usize, max: usize| match &settings[key] {
            Value::Null => Ok(default),
            v => bounded(key, v, max),
        };
        // `size` (transformers 5) or the older `min_pixels` / `max_pixels`.
        let pixels = |edge: &str, key: &str, default: usize| match &settings["size"][edge] {
            Value::Null => size(key, default, MAX_PIXELS),
            v => bounded(&format!("size.{edge}"), v, MAX_PIXELS),
        };
        let (min_pixels, max_pixels) = (
            pixels("shortest_edge", "min_pixels", 56 * 56)?,
            pixels("longest_edge", "max_pixels", 28 * 28 * 1280)?,
        );
        if min_pixels > max_pixels {
            return Err(format!(
                "`size`: min_pixels {min_pixels} is over max_pixels {max_pixels}"
            ));
        }
        let (patch_size, merge_size) = (size("patch_size", 14, 64)?, size("merge_size", 2, 8)?);
        let factor = patch_size * merge_size;
        if factor * factor > max_pixels {
            return Err(format!(
                "`patch_size` × `merge_size` is {factor}: one merged patch is over max_pixels {max_pixels}"
            ));
        }
        Ok(Self {
            convert_rgb: s.flag("do_convert_rgb", true),
            resize: s.flag("do_resize", true).then_some((min_pixels, max_pixels)),
            filter: s.filter(3)?,
            samples: s.sample_values(CLIP_MEAN, CLIP_STD)?,
            patch_size,
            temporal_patch_size: size("temporal_patch_size", 2, 8)?,
            merge_size,
        })
    }

    /// Whether images other than RGB are laid over white first (`do_convert_rgb`).
    pub fn converts_to_rgb(&self) -> bool {
        self.convert_rgb
    }

    /// The side of a merged patch in pixels: resized images are multiples of it.
    pub fn factor(&self) -> usize {
        self.patch_size * self.merge_size
    }

    /// The image tokens an image of `grid` takes in the prompt.
    pub fn image_tokens(&self, grid: (usize, usize, usize)) -> usize {
        grid.0 * grid.1 * grid.2 / (self.merge_size * self.merge_size)
    }

    /// The patches of `image` (8-bit RGB, as [`super::decode_rgb`] gives); an error when its
    /// aspect ratio is over 200 or, not resized, its sides are not multiples of
    /// [`Qwen2VlProcessor::factor`].
    pub fn process(&self, image: &Pixels) -> Result<Qwen2VlImage, String> {
        let factor = self.factor();
        let resized;
        let image = match self.resize {
            Some((min_pixels, max_pixels)) => {
                let (height, width) = smart_resize(image.height, image.width, factor, min_pixels, max_pixels)?;
                resized = image.resize(width, height, self.filter);
                &resized
            }
            None if image.height * image.width > MAX_PIXELS => {
                return Err(format!(
                    "the image is {}x{}: without resizing it may have at most {MAX_PIXELS} pixels",
                    image.width, image.height
                ));
            }
            None if !image.height.is_multiple_of(factor) || !image.width.is_multiple_of(factor) => {
                return Err(format!(
                    "the image is {}x{}: without resizing its sides must be multiples of {factor}",
                    image.width, image.height
                ));
            }
            None => image,
        };
        let (p, m, t) = (self.patch_size, self.merge_size, self.temporal_patch_size);
        let (grid_h, grid_w) = (image.height / p, image.width / p);
        let mut patches = Vec::with_capacity(grid_h * grid_w * 3 * t * p * p);
        for (block_y, block_x) in (0..grid_h / m).flat_map(|y| (0..grid_w / m).map(move |x| (y, x))) {
            for (in_y, in_x) in (0..m).flat_map(|y| (0..m).map(move |x| (y, x))) {
                let (y0, x0) = ((block_y * m + in_y) * p, (block_x * m + in_x) * p);
                for channel in 0..3 {
                    let plane: Vec<f32> = (0..p * p)
                        .map(|i| {
                            let at = ((y0 + i / p) * image.width + x0 + i % p) * image.channels + channel;
                            self.samples.value(image.data[at], channel)
                        })
                        .collect();
                    for _ in 0..t {
                        patches.extend_from_slice(&plane);
                    }
                }
            }
        }
        Ok(Qwen2VlImage {
            patches,
            grid: (1, grid_h, grid_w),
        })
    }

    /// `text` with its `<|image_pad|>` tokens (one per image, as the chat template writes them)
    /// expanded for `images`, in order.
    pub fn expand_prompt(&self, text: &str, images: &[impl Borrow<Qwen2VlImage>]) -> Result<String, String> {
        expand_markers(text, QWEN2_VL_IMAGE_TOKEN, images, |image| {
            QWEN2_VL_IMAGE_TOKEN.repeat(self.image_tokens(image.borrow().grid))
        })
    }

    /// `text` with each `<image>` marker (rein's data format, one per image) replaced by the
    /// image's expansion between `<|vision_start|>` and `<|vision_end|>`, as Qwen2-VL's chat
    /// template and processor write an image.
    pub fn expand_image_markers(&self, text: &str, images: &[impl Borrow<Qwen2VlImage>]) -> Result<String, String> {
        expand_markers(text, super::IMAGE_TOKEN, images, |image| {
            format!(
                "{VISION_START}{}{VISION_END}",
                QWEN2_VL_IMAGE_TOKEN.repeat(self.image_tokens(image.borrow().grid))
            )
        })
    }
}

/// transformers' `smart_resize`: `(height, width)` rounded to multiples of `factor` (Python's
/// `round`, halves to even), scaled down into `max_pixels` or up into `min_pixels` when the
/// rounded area leaves them; an error for an aspect ratio over 200.
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: usize,
    max_pixels: usize,
) -> Result<(usize, usize), String> {
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    if h.max(w) / h.min(w) > MAX_ASPECT_RATIO {
        return Err(format!(
            "the image is {width}x{height}: its aspect ratio is over {MAX_ASPECT_RATIO}"
        ));
    }
    let (mut h_bar, mut w_bar) = ((h / f).round_ties_even() * f, (w / f).round_ties_even() * f);
    if h_bar * w_bar > max_pixels as f64 {
        let beta = (h * w / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    Ok((h_bar as usize, w_bar as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn processor(settings: Value) -> Qwen2VlProcessor {
        Qwen2VlProcessor::from_json(&settings).unwrap()
    }

    #[test]
    fn smart_resize_keeps_the_area_within_bounds_in_multiples_of_the_factor() {
        // transformers' own results. Rounded to the nearest multiple, halves to even (70 / 28 =
        // 2.5 gives 56, not 84); an area under min_pixels scaled up; over max_pixels, down.
        assert_eq!(smart_resize(100, 60, 28, 56 * 56, 28 * 28 * 1280), Ok((112, 56)));
        assert_eq!(smart_resize(42, 70, 28, 56, 1_000_000), Ok((56, 56)));
        assert_eq!(smart_resize(14, 14, 28, 56 * 56, 28 * 28 * 1280), Ok((56, 56)));
        assert_eq!(smart_resize(1000, 2000, 28, 56 * 56, 200_000), Ok((308, 616)));
        let wide = smart_resize(10, 2010, 28, 56 * 56, 28 * 28 * 1280).unwrap_err();
        assert!(wide.contains("aspect ratio is over 200"), "{wide}");
    }

    #[test]
    fn patches_are_listed_merge_block_by_merge_block_with_repeated_frames() {
        // No rescale or normalisation: the values are the samples.
        let p = processor(serde_json::json!({
            "do_resize": false, "do_rescale": false, "do_normalize": false,
            "patch_size": 1, "merge_size": 2, "temporal_patch_size": 2
        }));
        // A 2 x 4 image whose red channel counts 0..8 across rows.
        let data: Vec<u8> = (0..8u8).flat_map(|i| [i, 100 + i, 200]).collect();
        let image = p
            .process(&Pixels {
                width: 4,
                height: 2,
                channels: 3,
                data,
            })
            .unwrap();
        assert_eq!(image.grid, (1, 2, 4));
        let reds: Vec<f32> = image.patches.chunks(6).map(|row| row[0]).collect();
        // Block (0,0) holds pixels 0, 1, 4, 5; block (0,1) pixels 2, 3, 6, 7.
        assert_eq!(reds, [0.0, 1.0, 4.0, 5.0, 2.0, 3.0, 6.0, 7.0]);
        assert_eq!(&image.patches[..6], &[0.0, 0.0, 100.0, 100.0, 200.0, 200.0]);
        assert_eq!(p.image_tokens(image.grid), 2);
        let text = p
            .expand_prompt("a<|image_pad|>b", std::slice::from_ref(&image))
            .unwrap();
        assert_eq!(text, "a<|image_pad|><|image_pad|>b");
        assert!(p.expand_prompt("none", std::slice::from_ref(&image)).is_err());
        let odd = p
            .process(&Pixels {
                width: 3,
                height: 2,
                channels: 3,
                data: vec![0; 18],
            })
            .unwrap_err();
        assert!(odd.contains("multiples of 2"), "{odd}");
        // Not resized, an image over MAX_PIXELS is refused before its patches are allocated.
        let huge = Pixels {
            width: MAX_PIXELS + 2,
            height: 1,
            channels: 3,
            data: vec![0; (MAX_PIXELS + 2) * 3],
        };
        let error = p.process(&huge).unwrap_err();
        assert!(error.contains("at most 16777216 pixels"), "{error}");
    }

    #[test]
    fn settings_are_read_with_qwen2_vl_defaults_and_refused_by_key() {
        let p = processor(serde_json::json!({"min_pixels": 3136, "max_pixels": 12845056}));
        assert_eq!(
            (p.resize, p.factor(), p.filter),
            (Some((3136, 12_845_056)), 28, Filter::Bicubic)
        );
        let p = processor(serde_json::json!({"size": {"shortest_edge": 100, "longest_edge": 1000}}));
        assert_eq!(p.resize, Some((100, 1000)));
        for (bad, says) in [
            (
                serde_json::json!({"image_processor_type": "SiglipImageProcessor"}),
                "image_processor_type",
            ),
            (serde_json::json!({"patch_size": 0}), "`patch_size`"),
            (
                serde_json::json!({"patch_size": 100000}),
                "`patch_size`: expected an integer from 1 to 64",
            ),
            (
                serde_json::json!({"temporal_patch_size": 1000}),
                "`temporal_patch_size`",
            ),
            (
                serde_json::json!({"max_pixels": 1u64 << 40}),
                "`max_pixels`: expected an integer from 1 to 16777216",
            ),
            (
                serde_json::json!({"size": {"shortest_edge": 1, "longest_edge": 1u64 << 40}}),
                "`size.longest_edge`",
            ),
            (
                serde_json::json!({"patch_size": 64, "merge_size": 8, "max_pixels": 4096}),
                "one merged patch is over",
            ),
            (
                serde_json::json!({"min_pixels": 10, "max_pixels": 5}),
                "min_pixels 10 is over",
            ),
            (serde_json::json!({"image_std": [1, 0, 1]}), "`image_std`"),
        ] {
            let error = Qwen2VlProcessor::from_json(&bad).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}

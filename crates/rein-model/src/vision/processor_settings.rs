//! The settings image processors share in `preprocessor_config.json`: whether to convert to RGB,
//! the resampling filter, the rescale factor and the per-channel normalisation, read with each
//! processor's defaults, and how one 8-bit sample becomes a pixel value.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::resample::Filter;
use crate::lm::LoadError;
use crate::lm::json_file::read_json;

/// The image processor's settings in the model directory `dir` and the file they came from:
/// `preprocessor_config.json`, or the `image_processor` of transformers 5's
/// `processor_config.json` (`processor`, when the caller has read it).
pub(crate) fn processor_settings(dir: &Path, processor: Option<Value>) -> Result<(PathBuf, Value), LoadError> {
    let preprocessor = dir.join("preprocessor_config.json");
    if preprocessor.is_file() {
        return Ok((preprocessor.clone(), read_json(&preprocessor)?));
    }
    let processor_path = dir.join("processor_config.json");
    let processor = match processor {
        Some(p) => Some(p),
        None if processor_path.is_file() => Some(read_json(&processor_path)?),
        None => None,
    };
    match processor.filter(|p| p["image_processor"].is_object()) {
        Some(mut processor) => Ok((processor_path, processor["image_processor"].take())),
        None => Err(LoadError::Io {
            path: preprocessor,
            reason: "no image processor settings (nor an `image_processor` in processor_config.json)".into(),
        }),
    }
}

/// A processor's settings object, read key by key; errors name the key.
pub(crate) struct Settings<'a>(pub(crate) &'a Value);

impl Settings<'_> {
    /// Refuses an `image_processor_type` (its class, or a variant of it: `…Fast`, `…Pil`) other
    /// than `class`, naming it as not `what` (`an Idefics3 image processor`); none is accepted.
    pub(crate) fn expect_class(&self, class: &str, what: &str) -> Result<(), String> {
        match self.0["image_processor_type"].as_str() {
            Some(kind) if !kind.starts_with(class) => Err(format!("`image_processor_type`: `{kind}` is not {what}")),
            _ => Ok(()),
        }
    }

    /// A boolean key, `default` when absent.
    pub(crate) fn flag(&self, key: &str, default: bool) -> bool {
        self.0[key].as_bool().unwrap_or(default)
    }

    /// `resample` (a Pillow filter code), `default` when absent.
    pub(crate) fn filter(&self, default: u64) -> Result<Filter, String> {
        let code = self.0["resample"].as_u64().unwrap_or(default);
        Filter::from_pil(code)
            .ok_or_else(|| format!("`resample`: {code} is not a resampling filter rein implements (1-5)"))
    }

    /// Three per-channel numbers (or one for all), `default` when absent.
    pub(crate) fn channels(&self, key: &str, default: [f32; 3]) -> Result<[f32; 3], String> {
        match &self.0[key] {
            Value::Null => Ok(default),
            Value::Number(n) => Ok([n.as_f64().unwrap_or_default() as f32; 3]),
            Value::Array(values) if values.len() == 3 && values.iter().all(Value::is_number) => {
                Ok(std::array::from_fn(|i| values[i].as_f64().unwrap_or_default() as f32))
            }
            other => Err(format!("`{key}`: expected three numbers, found {other}")),
        }
    }

    /// How samples become pixel values: `do_rescale`/`rescale_factor` and
    /// `do_normalize`/`image_mean`/`image_std`, with the processor's default mean and std.
    pub(crate) fn sample_values(&self, mean: [f32; 3], std: [f32; 3]) -> Result<SampleValues, String> {
        let std = self.channels("image_std", std)?;
        if std.contains(&0.0) {
            return Err("`image_std`: a standard deviation of 0".into());
        }
        Ok(SampleValues {
            rescale_factor: (self.flag("do_rescale", true))
                .then(|| self.0["rescale_factor"].as_f64().unwrap_or(1.0 / 255.0)),
            normalize: (self.flag("do_normalize", true))
                .then(|| Ok::<_, String>((self.channels("image_mean", mean)?, std)))
                .transpose()?,
        })
    }
}

/// How an 8-bit sample becomes a pixel value: rescaled, then normalised per channel.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SampleValues {
    rescale_factor: Option<f64>,
    /// `(mean, std)` per channel, if normalising.
    normalize: Option<([f32; 3], [f32; 3])>,
}

impl SampleValues {
    /// One sample of `channel` rescaled (in `f64`, then rounded to `f32` as numpy's `rescale`
    /// does) and normalised in `f32`.
    pub(crate) fn value(&self, sample: u8, channel: usize) -> f32 {
        let mut v = match self.rescale_factor {
            Some(factor) => (f64::from(sample) * factor) as f32,
            None => f32::from(sample),
        };
        if let Some((mean, std)) = &self.normalize {
            v = (v - mean[channel]) / std[channel];
        }
        v
    }
}

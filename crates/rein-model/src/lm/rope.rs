//! Rotary position embeddings (Su et al. 2021), the Hugging Face "rotate half" layout.
//!
//! ```text
//! inv_freq_i = 1 / θ^(2i / d)                       (then scaled: linear ÷ factor, or Llama 3's bands)
//! x' = x · cos(p · inv_freq) + rotate_half(x) · sin(p · inv_freq),   rotate_half([a, b]) = [−b, a]
//! ```

use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};

use super::LmConfig;
use crate::backend::ReinBackend;

/// The inverse frequencies, computed in `f32` as transformers does, with scaling applied.
pub fn inverse_frequencies(config: &LmConfig) -> Vec<f32> {
    frequencies_of(config, config.rope_theta, config.rope_scaling.as_ref())
}

/// `1 / θ^(2i / dim)` for `i < dim / 2`, in `f32` as transformers computes them: the unscaled
/// inverse frequencies of `dim` rotated dimensions (a head's, or Qwen2-VL's vision axes' half).
pub(crate) fn base_frequencies(theta: f64, dim: usize) -> Vec<f32> {
    let base = theta as f32;
    (0..dim / 2)
        .map(|i| 1.0 / base.powf((2 * i) as f32 / dim as f32))
        .collect()
}

/// The inverse frequencies of base `theta`, scaled by `scaling`.
fn frequencies_of(config: &LmConfig, theta: f64, scaling: Option<&super::RopeScaling>) -> Vec<f32> {
    let inv = base_frequencies(theta, config.head_dim());
    let Some(scaling) = scaling else {
        return inv;
    };
    let factor = scaling.factor as f32;
    match scaling.rope_type.as_str() {
        "linear" => inv.iter().map(|f| f / factor).collect(),
        "llama3" => {
            let low = scaling.low_freq_factor.unwrap_or(1.0) as f32;
            let high = scaling.high_freq_factor.unwrap_or(4.0) as f32;
            let old = scaling.original_max_position_embeddings.unwrap_or(8192) as f32;
            let (low_wavelen, high_wavelen) = (old / low, old / high);
            inv.iter()
                .map(|&f| {
                    let wavelen = 2.0 * std::f32::consts::PI / f;
                    if wavelen > low_wavelen {
                        f / factor
                    } else if wavelen < high_wavelen {
                        f
                    } else {
                        let smooth = (old / wavelen - low) / (high - low);
                        (1.0 - smooth) * f / factor + smooth * f
                    }
                })
                .collect()
        }
        _ => inv,
    }
}

/// Precomputed `cos` and `sin` tables for positions `0..max_len`: the model's, and for Gemma 3
/// those of its sliding layers' own base.
#[derive(Debug, Clone)]
pub struct Rope<B: ReinBackend> {
    global: Tables<B>,
    local: Option<Tables<B>>,
}

/// `cos` and `sin`, each `[max_len, head_dim]`.
#[derive(Debug, Clone)]
struct Tables<B: ReinBackend> {
    cos: Tensor<B, 2>,
    sin: Tensor<B, 2>,
}

impl<B: ReinBackend> Rope<B> {
    /// Tables for `max_len` positions.
    pub fn new(config: &LmConfig, max_len: usize, device: &B::Device) -> Self {
        Self {
            global: Tables::new(&inverse_frequencies(config), max_len, device),
            local: config
                .rope_local_base_freq
                .map(|theta| Tables::new(&frequencies_of(config, theta, None), max_len, device)),
        }
    }

    /// Tables of one row per token for Qwen2-VL's multimodal RoPE: token `r` at the three
    /// positions `positions[r]` (temporal, height, width), each frequency rotated by the axis
    /// whose section of `section` (counted over the `head_dim / 2` frequencies) holds it, as
    /// transformers' `Qwen2VLRotaryEmbedding` recomposes them. Apply them at positions
    /// `0..positions.len()` (the tokens' own rows). A token whose three positions are equal gets
    /// [`Rope::new`]'s row of that position.
    ///
    /// # Panics
    /// When `section` does not sum to `head_dim / 2`.
    pub fn multimodal(config: &LmConfig, positions: &[[i64; 3]], section: [usize; 3], device: &B::Device) -> Self {
        let inv = inverse_frequencies(config);
        assert_eq!(section.iter().sum::<usize>(), inv.len(), "mrope_section {section:?}");
        let axis = |i: usize| usize::from(i >= section[0]) + usize::from(i >= section[0] + section[1]);
        Self::of_angles(positions.len(), inv.len(), device, |row, i| {
            positions[row][axis(i)] as f32 * inv[i]
        })
    }

    /// Tables of `rows` rows whose columns `i` and `i + half` rotate by `angle(row, i)`, applied
    /// at positions `0..rows`.
    pub(crate) fn of_angles(rows: usize, half: usize, device: &B::Device, angle: impl Fn(usize, usize) -> f32) -> Self {
        Self {
            global: Tables::of_angles(rows, half, device, angle),
            local: None,
        }
    }

    /// Positions the tables cover.
    pub fn max_len(&self) -> usize {
        self.global.cos.dims()[0]
    }

    /// Rotates `x` by per-token positions, with the local tables when `local` (and the model
    /// has them).
    ///
    /// # Shapes
    /// - `x`: `[batch, heads, seq, head_dim]`, `positions`: `[batch, seq]` → like `x`
    pub fn apply(&self, x: Tensor<B, 4>, positions: &Tensor<B, 2, Int>, local: bool) -> Tensor<B, 4> {
        let tables = match (local, &self.local) {
            (true, Some(local)) => local,
            _ => &self.global,
        };
        let rotated = B::rope(
            x.into_primitive().tensor(),
            positions.clone().into_primitive(),
            tables.cos.clone().into_primitive().tensor(),
            tables.sin.clone().into_primitive().tensor(),
        );
        Tensor::from_primitive(TensorPrimitive::Float(rotated))
    }
}

impl<B: ReinBackend> Tables<B> {
    fn new(inv: &[f32], max_len: usize, device: &B::Device) -> Self {
        Self::of_angles(max_len, inv.len(), device, |p, i| p as f32 * inv[i])
    }

    /// `rows` rows whose columns `i` and `i + half` rotate by `angle(row, i)`, in `f32` as
    /// transformers computes them.
    fn of_angles(rows: usize, half: usize, device: &B::Device, angle: impl Fn(usize, usize) -> f32) -> Self {
        let mut cos = Vec::with_capacity(rows * half * 2);
        let mut sin = Vec::with_capacity(rows * half * 2);
        for row in 0..rows {
            for _ in 0..2 {
                for i in 0..half {
                    let angle = angle(row, i);
                    cos.push(angle.cos());
                    sin.push(angle.sin());
                }
            }
        }
        let table = |v: Vec<f32>| Tensor::from_data(TensorData::new(v, [rows, 2 * half]), device);
        Self {
            cos: table(cos),
            sin: table(sin),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(scaling: Option<&str>) -> LmConfig {
        let scaling = scaling.map(|s| format!(r#", "rope_scaling": {s}"#)).unwrap_or_default();
        LmConfig::from_json(
            serde_json::from_str(&format!(
                r#"{{"model_type": "llama", "vocab_size": 8, "hidden_size": 16, "intermediate_size": 8,
                "num_hidden_layers": 1, "num_attention_heads": 2, "rope_theta": 10000.0{scaling}}}"#
            ))
            .unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn multimodal_tables_of_equal_positions_are_the_plain_tables() {
        type F = burn::backend::Flex;
        let device = Default::default();
        let c = config(None);
        let rows = |t: &Tensor<F, 2>| t.clone().into_data().to_vec::<f32>().unwrap();
        let plain = Rope::<F>::new(&c, 6, &device);
        let positions: Vec<[i64; 3]> = (0..6).map(|p| [p; 3]).collect();
        let multimodal = Rope::<F>::multimodal(&c, &positions, [2, 1, 1], &device);
        assert_eq!(rows(&multimodal.global.cos), rows(&plain.global.cos));
        assert_eq!(rows(&multimodal.global.sin), rows(&plain.global.sin));
        // Time 0, height 3, width 5: frequencies 0-1 turn by time, 2 by height, 3 by width.
        let at = Rope::<F>::multimodal(&c, &[[0, 3, 5]], [2, 1, 1], &device);
        let inv = inverse_frequencies(&c);
        let want: Vec<f32> = [0.0, 0.0, 3.0 * inv[2], 5.0 * inv[3]]
            .repeat(2)
            .iter()
            .map(|a| a.cos())
            .collect();
        assert_eq!(rows(&at.global.cos), want);
    }

    #[test]
    fn default_and_linear_frequencies() {
        let inv = inverse_frequencies(&config(None));
        assert_eq!(inv.len(), 4);
        assert_eq!(inv[0], 1.0);
        assert!((inv[1] - 0.1).abs() < 1e-7);
        let linear = inverse_frequencies(&config(Some(r#"{"type": "linear", "factor": 2.0}"#)));
        assert_eq!(linear[0], 0.5);
    }

    #[test]
    fn llama3_keeps_high_frequencies_and_scales_low_ones() {
        let inv = inverse_frequencies(&config(None));
        let scaled = inverse_frequencies(&config(Some(
            r#"{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}"#,
        )));
        assert_eq!(scaled[0], inv[0], "wavelength 2π < 16: kept");
        assert!(
            (scaled[3] - inv[3] / 8.0).abs() < 1e-9,
            "wavelength 2π·1000 > 64: scaled"
        );
    }
}

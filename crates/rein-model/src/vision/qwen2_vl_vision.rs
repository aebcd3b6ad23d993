//! Qwen2-VL's vision transformer (transformers' `Qwen2VisionTransformerPretrainedModel`): the
//! processor's patches projected (the checkpoint's `Conv3d` over `channels × frames × patch ×
//! patch`, read as one matrix), pre-norm blocks whose bidirectional attention covers one image at
//! a time and rotates queries and keys by each patch's row and column (2-D RoPE: the first half
//! of each head's frequencies by the row, the second by the column), LayerNorms and a
//! `quick_gelu` MLP with biases, and the patch merger (a LayerNorm, then each `merge × merge`
//! block of patches concatenated and projected by Linear–GELU–Linear into the decoder's width).
//!
//! ```text
//! inv_freq_i = 1 / θ^(2i / (head_dim / 2)),  i < head_dim / 4
//! angle(patch, i) = row · inv_freq_i  (i < head_dim / 4),  column · inv_freq_(i − head_dim/4)  (else)
//! ```
//!
//! The processor lays each image's patches out merge block by merge block, so the merger's
//! blocks are consecutive rows.

use burn::module::{Module, Param};
use burn::nn::{LayerNorm, Linear};
use burn::tensor::activation::{gelu, sigmoid, softmax};
use burn::tensor::{Int, Tensor};
use serde_json::Value;

use crate::backend::{ReinBackend, affine};
use crate::lm::Rope;

/// `vision_config` of a Qwen2-VL `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2VlVisionConfig {
    /// Blocks.
    pub depth: usize,
    /// Width of the patch embeddings and blocks.
    pub embed_dim: usize,
    /// Width of the merged features: the decoder's hidden size.
    pub hidden_size: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Width of each block's MLP (`embed_dim · mlp_ratio`).
    pub mlp_hidden: usize,
    /// The MLP's activation.
    pub activation: Qwen2VlActivation,
    /// Channels of the pixel values (3).
    pub in_channels: usize,
    /// The side of a patch.
    pub patch_size: usize,
    /// Frames per patch (a still image repeats its frame).
    pub temporal_patch_size: usize,
    /// The merger concatenates `spatial_merge_size²` patches into one feature.
    pub spatial_merge_size: usize,
    /// The base of the 2-D rotary frequencies.
    pub rope_theta: f64,
}

/// The vision MLP's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qwen2VlActivation {
    /// `quick_gelu`: `x · σ(1.702 x)`, Qwen2-VL's.
    QuickGelu,
    /// `gelu`: GELU with `erf`.
    Gelu,
}

/// Sizes a config may give before anything is allocated from them.
const MAX_SIZE: u64 = 1 << 16;

impl Qwen2VlVisionConfig {
    /// The config `value` describes (transformers' `Qwen2VLVisionConfig`, with its defaults);
    /// an error naming the key of a value rein cannot run.
    pub fn from_json(value: &Value) -> Result<Self, String> {
        let size = |key: &str, default: u64, max: u64| -> Result<usize, String> {
            match &value[key] {
                Value::Null => Ok(default as usize),
                v => match v.as_u64() {
                    Some(n) if n > 0 && n <= max => Ok(n as usize),
                    _ => Err(format!(
                        "vision_config.{key}: expected an integer in 1..={max}, found {v}"
                    )),
                },
            }
        };
        let activation = match value["hidden_act"].as_str().unwrap_or("quick_gelu") {
            "quick_gelu" => Qwen2VlActivation::QuickGelu,
            "gelu" => Qwen2VlActivation::Gelu,
            other => {
                return Err(format!(
                    "vision_config.hidden_act: `{other}` is not supported (quick_gelu, gelu)"
                ));
            }
        };
        let embed_dim = size("embed_dim", 1280, MAX_SIZE)?;
        let mlp_ratio = match &value["mlp_ratio"] {
            Value::Null => 4.0,
            v => match v.as_f64() {
                Some(r) if r > 0.0 && r <= 64.0 => r,
                _ => {
                    return Err(format!(
                        "vision_config.mlp_ratio: expected a number in (0, 64], found {v}"
                    ));
                }
            },
        };
        let config = Self {
            depth: size("depth", 32, 1024)?,
            embed_dim,
            hidden_size: size("hidden_size", 3584, MAX_SIZE)?,
            num_heads: size("num_heads", 16, 1024)?,
            mlp_hidden: (embed_dim as f64 * mlp_ratio) as usize,
            activation,
            in_channels: size("in_channels", 3, 3)?,
            patch_size: size("patch_size", 14, 64)?,
            temporal_patch_size: size("temporal_patch_size", 2, 8)?,
            spatial_merge_size: size("spatial_merge_size", 2, 8)?,
            rope_theta: value["rope_parameters"]["rope_theta"].as_f64().unwrap_or(10000.0),
        };
        if config.in_channels != 3 {
            return Err(format!(
                "vision_config.in_channels: {} (rein reads RGB images)",
                config.in_channels
            ));
        }
        let head_dim = config.embed_dim / config.num_heads;
        if !config.embed_dim.is_multiple_of(config.num_heads) || !head_dim.is_multiple_of(4) {
            return Err(format!(
                "vision_config: embed_dim {} over num_heads {} is not a head width divisible by 4 (2-D RoPE)",
                config.embed_dim, config.num_heads
            ));
        }
        if config.mlp_hidden == 0 {
            return Err("vision_config.mlp_ratio: the MLP has no width".into());
        }
        Ok(config)
    }

    /// Values per patch: `channels · frames · patch²`.
    pub fn patch_values(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Width of a head.
    pub fn head_dim(&self) -> usize {
        self.embed_dim / self.num_heads
    }
}

/// One block.
#[derive(Module, Debug)]
pub struct Qwen2VlVisionBlock<B: ReinBackend> {
    /// Before attention.
    pub norm1: LayerNorm<B>,
    /// Queries, keys and values in one projection, `[embed, 3 · embed]`.
    pub qkv: Linear<B>,
    /// The attention's output projection.
    pub proj: Linear<B>,
    /// Before the MLP.
    pub norm2: LayerNorm<B>,
    /// The MLP's first layer.
    pub fc1: Linear<B>,
    /// The MLP's second layer.
    pub fc2: Linear<B>,
}

/// The patch merger.
#[derive(Module, Debug)]
pub struct PatchMerger<B: ReinBackend> {
    /// Each patch's norm, before merging.
    pub ln_q: LayerNorm<B>,
    /// `[embed · merge², embed · merge²]`.
    pub fc1: Linear<B>,
    /// `[embed · merge², hidden]`.
    pub fc2: Linear<B>,
}

/// Qwen2-VL's vision transformer and patch merger: patches to features in the decoder's width.
#[derive(Module, Debug)]
pub struct Qwen2VlVision<B: ReinBackend> {
    /// The patch projection, `[channels · frames · patch², embed]` (the convolution's kernel).
    pub patch_embed: Param<Tensor<B, 2>>,
    /// The blocks.
    pub blocks: Vec<Qwen2VlVisionBlock<B>>,
    /// The merger.
    pub merger: PatchMerger<B>,
    #[module(skip)]
    config: Qwen2VlVisionConfig,
}

fn linear<B: ReinBackend>(layer: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    affine(x, layer.weight.val(), layer.bias.as_ref().map(|b| b.val()))
}

impl<B: ReinBackend> Qwen2VlVision<B> {
    /// A tower of these parts, as a checkpoint holds them.
    pub fn from_parts(
        patch_embed: Param<Tensor<B, 2>>,
        blocks: Vec<Qwen2VlVisionBlock<B>>,
        merger: PatchMerger<B>,
        config: Qwen2VlVisionConfig,
    ) -> Self {
        Self {
            patch_embed,
            blocks,
            merger,
            config,
        }
    }

    /// The tower's config.
    pub fn config(&self) -> &Qwen2VlVisionConfig {
        &self.config
    }

    /// The merged features of the images whose patches are `patches` (image after image, as
    /// [`super::Qwen2VlProcessor`] lays them out) and whose grids are `grids`
    /// (`(frames, rows, columns)` of patches), `rows · columns / merge²` per frame.
    ///
    /// # Panics
    /// When the grids do not account for every patch, or a grid's rows or columns are not a
    /// multiple of the merge size.
    ///
    /// # Shapes
    /// - `patches`: `[patches, channels · frames · patch²]` → `[patches / merge², hidden]`
    pub fn forward(&self, patches: Tensor<B, 2>, grids: &[(usize, usize, usize)]) -> Tensor<B, 2> {
        let [count, _] = patches.dims();
        let m = self.config.spatial_merge_size;
        assert_eq!(
            grids.iter().map(|(t, h, w)| t * h * w).sum::<usize>(),
            count,
            "grids {grids:?} for {count} patches"
        );
        assert!(
            grids.iter().all(|&(_, h, w)| h % m == 0 && w % m == 0),
            "grids {grids:?} are not in merge blocks of {m}"
        );
        let rope = self.rotary_tables(grids, &patches.device());
        let frames: Vec<usize> = grids
            .iter()
            .flat_map(|&(t, h, w)| std::iter::repeat_n(h * w, t))
            .collect();
        let mut x = affine(patches, self.patch_embed.val(), None);
        for block in &self.blocks {
            x = self.block(block, x, &rope, &frames);
        }
        let e = self.config.embed_dim;
        let merged = self.merger.ln_q.forward(x).reshape([count / (m * m), e * m * m]);
        linear(&self.merger.fc2, gelu(linear(&self.merger.fc1, merged)))
    }

    /// Each patch's rotary row: the first `head_dim / 4` frequencies turned by its row, the next
    /// by its column (the processor's order: frame by frame, merge block by merge block).
    fn rotary_tables(&self, grids: &[(usize, usize, usize)], device: &B::Device) -> Rope<B> {
        let m = self.config.spatial_merge_size;
        let rows_columns: Vec<(usize, usize)> = grids
            .iter()
            .flat_map(|&(t, h, w)| {
                let frame = (0..h / m).flat_map(move |bh| {
                    (0..w / m)
                        .flat_map(move |bw| (0..m).flat_map(move |i| (0..m).map(move |j| (bh * m + i, bw * m + j))))
                });
                std::iter::repeat_n(frame.collect::<Vec<_>>(), t).flatten()
            })
            .collect();
        let spatial = self.config.head_dim() / 2;
        let base = self.config.rope_theta as f32;
        let inv: Vec<f32> = (0..spatial / 2)
            .map(|i| 1.0 / base.powf((2 * i) as f32 / spatial as f32))
            .collect();
        let quarter = inv.len();
        Rope::of_angles(rows_columns.len(), spatial, device, |patch, i| {
            let (row, column) = rows_columns[patch];
            match i < quarter {
                true => row as f32 * inv[i],
                false => column as f32 * inv[i - quarter],
            }
        })
    }

    fn block(&self, block: &Qwen2VlVisionBlock<B>, x: Tensor<B, 2>, rope: &Rope<B>, frames: &[usize]) -> Tensor<B, 2> {
        let attended = self.attention(block, block.norm1.forward(x.clone()), rope, frames);
        let x = x + linear(&block.proj, attended);
        let h = linear(&block.fc1, block.norm2.forward(x.clone()));
        let h = match self.config.activation {
            Qwen2VlActivation::QuickGelu => quick_gelu(h),
            Qwen2VlActivation::Gelu => gelu(h),
        };
        x + linear(&block.fc2, h)
    }

    /// Multi-head attention of each patch over the patches of its own frame, queries and keys
    /// rotated by the patches' rows and columns: `[patches, embed]` (normed) →
    /// `[patches, embed]` before the output projection.
    fn attention(
        &self,
        block: &Qwen2VlVisionBlock<B>,
        h: Tensor<B, 2>,
        rope: &Rope<B>,
        frames: &[usize],
    ) -> Tensor<B, 2> {
        let [count, e] = h.dims();
        let (heads, head_dim) = (self.config.num_heads, self.config.head_dim());
        let scale = (head_dim as f64).powf(-0.5);
        let qkv = linear(&block.qkv, h);
        // `[1, heads, patches, head_dim]`, each patch at its own row of the tables.
        let positions = Tensor::<B, 1, Int>::arange(0..count as i64, &qkv.device()).unsqueeze::<2>();
        let part = |i: usize| {
            qkv.clone()
                .narrow(1, i * e, e)
                .reshape([1, count, heads, head_dim])
                .swap_dims(1, 2)
        };
        let rotate = |x: Tensor<B, 4>| rope.apply(x, &positions, false);
        let (q, k, v) = (rotate(part(0)), rotate(part(1)), part(2));
        let mut outputs = Vec::with_capacity(frames.len());
        let mut start = 0;
        for &len in frames {
            let per_head: Vec<Tensor<B, 2>> = (0..heads)
                .map(|head| {
                    let rows = |m: &Tensor<B, 4>| {
                        m.clone()
                            .slice([0..1, head..head + 1, start..start + len, 0..head_dim])
                            .reshape([len, head_dim])
                    };
                    let scores = affine(rows(&q), rows(&k).transpose(), None).mul_scalar(scale);
                    affine(softmax(scores, 1), rows(&v), None)
                })
                .collect();
            outputs.push(Tensor::cat(per_head, 1));
            start += len;
        }
        Tensor::cat(outputs, 0)
    }
}

/// `quick_gelu`: `x · σ(1.702 x)`.
fn quick_gelu<B: ReinBackend>(h: Tensor<B, 2>) -> Tensor<B, 2> {
    h.clone() * sigmoid(h.mul_scalar(1.702))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use burn::tensor::TensorData;

    #[test]
    fn quick_gelu_is_x_times_the_sigmoid_of_1_702_x() {
        let device = Default::default();
        let x = Tensor::<Flex, 2>::from_data(TensorData::new(vec![-2.0f32, 0.0, 1.5], [1, 3]), &device);
        let got: Vec<f32> = quick_gelu(x).into_data().to_vec().unwrap();
        let want: Vec<f32> = [-2.0f32, 0.0, 1.5]
            .iter()
            .map(|&v| v / (1.0 + (-1.702 * v).exp()))
            .collect();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn configs_rein_cannot_run_are_refused_by_key() {
        let refuse = |v: Value| Qwen2VlVisionConfig::from_json(&v).unwrap_err();
        assert!(refuse(serde_json::json!({"hidden_act": "silu"})).contains("hidden_act"));
        assert!(refuse(serde_json::json!({"embed_dim": 36, "num_heads": 6})).contains("divisible by 4"));
        assert!(refuse(serde_json::json!({"patch_size": 1000})).contains("vision_config.patch_size"));
        assert!(refuse(serde_json::json!({"depth": 0})).contains("vision_config.depth"));
        assert!(refuse(serde_json::json!({"in_channels": 1})).contains("in_channels"));
    }
}

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
//!
//! Qwen2.5-VL's tower (`Qwen2_5_VisionTransformerPretrainedModel`) differs in three places:
//! RMSNorms instead of LayerNorms (the merger's too), a gated SiLU MLP with biases, and window
//! attention — the merge blocks regrouped window by window (`window_size` pixels square), every
//! block but the `fullatt_block_indexes` attending within its window, the merged features put
//! back in the image's order at the end.

use burn::module::{Module, Param};
use burn::nn::{LayerNorm, Linear};
use burn::tensor::activation::{gelu, sigmoid, softmax};
use burn::tensor::{Int, Tensor, TensorData, TensorPrimitive};
use rein_gguf::GateActivation;
use serde_json::Value;

use super::vision_lora::{BlockLora, block_linear};
use crate::backend::{ReinBackend, affine};
use crate::lm::{RmsNorm, Rope, base_frequencies};

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
    /// Qwen2-VL's blocks or Qwen2.5-VL's.
    pub generation: Qwen2VlGeneration,
    /// Qwen2.5-VL: windows of this many merge blocks per side, and the blocks that attend over
    /// the whole image instead.
    pub windows: Option<Windows>,
}

/// Which Qwen-VL's vision tower.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qwen2VlGeneration {
    /// Qwen2-VL: LayerNorms, a two-layer MLP, full attention.
    Qwen2Vl,
    /// Qwen2.5-VL: RMSNorms, a gated SiLU MLP, window attention.
    Qwen2_5Vl,
}

/// Qwen2.5-VL's window attention.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Windows {
    /// Merge blocks along a window's side (`window_size / merge / patch`).
    pub side: usize,
    /// The blocks that attend over whole frames.
    pub full_blocks: Vec<usize>,
}

/// The vision MLP's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qwen2VlActivation {
    /// `quick_gelu`: `x · σ(1.702 x)`, Qwen2-VL's.
    QuickGelu,
    /// `gelu`: GELU with `erf`.
    Gelu,
    /// `silu`, gating Qwen2.5-VL's MLP.
    Silu,
}

/// Queries whose attention scores are computed at once (per head): `QUERY_BLOCK × frame` scores.
const QUERY_BLOCK: usize = 512;

/// Sizes a config may give before anything is allocated from them.
const MAX_SIZE: u64 = 1 << 16;

impl Qwen2VlVisionConfig {
    /// The config `value` describes (transformers' `Qwen2VLVisionConfig` or
    /// `Qwen2_5_VLVisionConfig` by `generation`, with its defaults); an error naming the key of
    /// a value rein cannot run.
    pub fn from_json(value: &Value, generation: Qwen2VlGeneration) -> Result<Self, String> {
        let size = |key: &str, default: u64, max: u64| size_of(value, key, default, max);
        let (default_act, supported) = match generation {
            Qwen2VlGeneration::Qwen2Vl => ("quick_gelu", "quick_gelu, gelu"),
            Qwen2VlGeneration::Qwen2_5Vl => ("silu", "silu"),
        };
        let activation = match (generation, value["hidden_act"].as_str().unwrap_or(default_act)) {
            (Qwen2VlGeneration::Qwen2Vl, "quick_gelu") => Qwen2VlActivation::QuickGelu,
            (Qwen2VlGeneration::Qwen2Vl, "gelu") => Qwen2VlActivation::Gelu,
            (Qwen2VlGeneration::Qwen2_5Vl, "silu") => Qwen2VlActivation::Silu,
            (_, other) => {
                return Err(format!(
                    "vision_config.hidden_act: `{other}` is not supported ({supported})"
                ));
            }
        };
        let patch_size = size("patch_size", 14, 64)?;
        let spatial_merge_size = size("spatial_merge_size", 2, 8)?;
        let (embed_dim, hidden_size, mlp_hidden, windows) = match generation {
            Qwen2VlGeneration::Qwen2Vl => qwen2_vl_widths(value)?,
            Qwen2VlGeneration::Qwen2_5Vl => qwen2_5_vl_widths(value, patch_size * spatial_merge_size)?,
        };
        let config = Self {
            depth: size("depth", 32, 1024)?,
            embed_dim,
            hidden_size,
            num_heads: size("num_heads", 16, 1024)?,
            mlp_hidden,
            activation,
            in_channels: size("in_channels", 3, 3)?,
            patch_size,
            temporal_patch_size: size("temporal_patch_size", 2, 8)?,
            spatial_merge_size,
            rope_theta: value["rope_parameters"]["rope_theta"].as_f64().unwrap_or(10000.0),
            generation,
            windows,
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
                "vision_config: a width of {} over {} heads is not a head width divisible by 4 (2-D RoPE)",
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

/// A positive integer at `key` of `value` (`default` when absent), at most `max`; an error
/// naming the key.
fn size_of(value: &Value, key: &str, default: u64, max: u64) -> Result<usize, String> {
    match &value[key] {
        Value::Null => Ok(default as usize),
        v => match v.as_u64() {
            Some(n) if n > 0 && n <= max => Ok(n as usize),
            _ => Err(format!(
                "vision_config.{key}: expected an integer in 1..={max}, found {v}"
            )),
        },
    }
}

/// Qwen2-VL's widths: `embed_dim`, the merged features' `hidden_size`, the MLP's
/// `embed_dim · mlp_ratio`; no windows.
fn qwen2_vl_widths(value: &Value) -> Result<(usize, usize, usize, Option<Windows>), String> {
    let embed_dim = size_of(value, "embed_dim", 1280, MAX_SIZE)?;
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
    let mlp_hidden = (embed_dim as f64 * mlp_ratio) as usize;
    Ok((
        embed_dim,
        size_of(value, "hidden_size", 3584, MAX_SIZE)?,
        mlp_hidden,
        None,
    ))
}

/// Qwen2.5-VL's widths (`hidden_size` is the blocks', `out_hidden_size` the merged features',
/// `intermediate_size` the MLP's) and windows of `window_size` pixels, merge blocks of `block`
/// pixels each.
fn qwen2_5_vl_widths(value: &Value, block: usize) -> Result<(usize, usize, usize, Option<Windows>), String> {
    let window_size = size_of(value, "window_size", 112, 1 << 14)?;
    let side = window_size / block;
    if side == 0 {
        return Err(format!(
            "vision_config.window_size: {window_size} pixels is less than one merge block of {block} pixels"
        ));
    }
    let depth = size_of(value, "depth", 32, 1024)?;
    let full_blocks: Vec<usize> = match &value["fullatt_block_indexes"] {
        Value::Null => vec![7, 15, 23, 31],
        v => (v.as_array())
            .and_then(|a| a.iter().map(|b| b.as_u64().map(|b| b as usize)).collect())
            .ok_or_else(|| format!("vision_config.fullatt_block_indexes: expected block numbers, found {v}"))?,
    };
    if let Some(b) = full_blocks.iter().find(|&&b| b >= depth) {
        return Err(format!(
            "vision_config.fullatt_block_indexes: block {b} is not one of the {depth} blocks"
        ));
    }
    Ok((
        size_of(value, "hidden_size", 1280, MAX_SIZE)?,
        size_of(value, "out_hidden_size", 3584, MAX_SIZE)?,
        size_of(value, "intermediate_size", 3420, MAX_SIZE)?,
        Some(Windows { side, full_blocks }),
    ))
}

/// A block's or the merger's norm: Qwen2-VL's LayerNorm or Qwen2.5-VL's RMSNorm.
#[derive(Module, Debug)]
pub enum VisionNorm<B: ReinBackend> {
    /// With a bias.
    Layer(LayerNorm<B>),
    /// Without.
    Rms(RmsNorm<B>),
}

impl<B: ReinBackend> VisionNorm<B> {
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        match self {
            VisionNorm::Layer(norm) => norm.forward(x),
            VisionNorm::Rms(norm) => norm.forward(x),
        }
    }
}

/// Qwen2-VL's MLP: `fc2(act(fc1 x))`.
#[derive(Module, Debug)]
pub struct TwoLayerMlp<B: ReinBackend> {
    /// The first layer.
    pub fc1: Linear<B>,
    /// The second layer.
    pub fc2: Linear<B>,
}

/// Qwen2.5-VL's MLP: `down(silu(gate x) ⊙ up x)`, with biases.
#[derive(Module, Debug)]
pub struct GatedMlp<B: ReinBackend> {
    /// `W_gate`.
    pub gate_proj: Linear<B>,
    /// `W_up`.
    pub up_proj: Linear<B>,
    /// `W_down`.
    pub down_proj: Linear<B>,
}

/// A block's MLP.
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)] // one per block, by value: the gated MLP's third layer
pub enum VisionMlp<B: ReinBackend> {
    /// Qwen2-VL's.
    TwoLayer(TwoLayerMlp<B>),
    /// Qwen2.5-VL's.
    Gated(GatedMlp<B>),
}

/// One block.
#[derive(Module, Debug)]
pub struct Qwen2VlVisionBlock<B: ReinBackend> {
    /// Before attention.
    pub norm1: VisionNorm<B>,
    /// Queries, keys and values in one projection, `[embed, 3 · embed]`.
    pub qkv: Linear<B>,
    /// The attention's output projection.
    pub proj: Linear<B>,
    /// Before the MLP.
    pub norm2: VisionNorm<B>,
    /// The MLP.
    pub mlp: VisionMlp<B>,
}

impl<B: ReinBackend> Qwen2VlVisionBlock<B> {
    /// Its linear layers with their transformers paths within the block: `attn.qkv`,
    /// `attn.proj`, then the MLP's (`mlp.fc1`, `mlp.fc2`; Qwen2.5-VL's `mlp.gate_proj`,
    /// `mlp.up_proj`, `mlp.down_proj`).
    pub fn linears(&self) -> Vec<(&'static str, &Linear<B>)> {
        let mut linears = vec![("attn.qkv", &self.qkv), ("attn.proj", &self.proj)];
        match &self.mlp {
            VisionMlp::TwoLayer(mlp) => linears.extend([("mlp.fc1", &mlp.fc1), ("mlp.fc2", &mlp.fc2)]),
            VisionMlp::Gated(mlp) => linears.extend([
                ("mlp.gate_proj", &mlp.gate_proj),
                ("mlp.up_proj", &mlp.up_proj),
                ("mlp.down_proj", &mlp.down_proj),
            ]),
        }
        linears
    }

    /// Its linear layers, in [`Qwen2VlVisionBlock::linears`] order.
    pub fn linears_mut(&mut self) -> Vec<&mut Linear<B>> {
        let mut linears = vec![&mut self.qkv, &mut self.proj];
        match &mut self.mlp {
            VisionMlp::TwoLayer(mlp) => linears.extend([&mut mlp.fc1, &mut mlp.fc2]),
            VisionMlp::Gated(mlp) => linears.extend([&mut mlp.gate_proj, &mut mlp.up_proj, &mut mlp.down_proj]),
        }
        linears
    }
}

/// The patch merger.
#[derive(Module, Debug)]
pub struct PatchMerger<B: ReinBackend> {
    /// Each patch's norm, before merging.
    pub ln_q: VisionNorm<B>,
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
        self.forward_adapted(patches, grids, &[])
    }

    /// [`Qwen2VlVision::forward`] with `lora[i]`'s adapters on block `i`'s linear layers (none
    /// past the end of `lora`).
    pub fn forward_adapted(
        &self,
        patches: Tensor<B, 2>,
        grids: &[(usize, usize, usize)],
        lora: &[BlockLora<B>],
    ) -> Tensor<B, 2> {
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
        let device = patches.device();
        let frames: Vec<usize> = grids
            .iter()
            .flat_map(|&(t, h, w)| std::iter::repeat_n(h * w, t))
            .collect();
        // Qwen2.5-VL: the merge blocks window by window (each frame's windows stay within it).
        let windows = (self.config.windows.as_ref()).map(|w| (w, window_order(grids, m, w.side)));
        let patch_order: Option<Vec<usize>> =
            (windows.as_ref()).map(|(_, (order, _))| order.iter().flat_map(|&b| b * m * m..(b + 1) * m * m).collect());
        let select = |x: Tensor<B, 2>, order: &[usize]| {
            let ids: Vec<i64> = order.iter().map(|&i| i as i64).collect();
            x.select(
                0,
                Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [order.len()]), &device),
            )
        };
        let patches = match &patch_order {
            Some(order) => select(patches, order),
            None => patches,
        };
        let rope = self.rotary_tables(grids, patch_order.as_deref(), &device);
        let mut x = affine(patches, self.patch_embed.val(), None);
        for (i, block) in self.blocks.iter().enumerate() {
            let segments = match &windows {
                Some((w, (_, lengths))) if !w.full_blocks.contains(&i) => lengths,
                _ => &frames,
            };
            x = self.block(block, lora.get(i), x, &rope, segments);
        }
        let e = self.config.embed_dim;
        let merged = self.merger.ln_q.forward(x).reshape([count / (m * m), e * m * m]);
        let features = linear(&self.merger.fc2, gelu(linear(&self.merger.fc1, merged)));
        match windows {
            Some((_, (order, _))) => {
                let mut back = vec![0; order.len()];
                for (k, &b) in order.iter().enumerate() {
                    back[b] = k;
                }
                select(features, &back)
            }
            None => features,
        }
    }

    /// Each patch's rotary row: the first `head_dim / 4` frequencies turned by its row, the next
    /// by its column (the processor's order: frame by frame, merge block by merge block; or
    /// `order`'s, the patches regrouped).
    fn rotary_tables(&self, grids: &[(usize, usize, usize)], order: Option<&[usize]>, device: &B::Device) -> Rope<B> {
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
        let rows_columns: Vec<(usize, usize)> = match order {
            Some(order) => order.iter().map(|&p| rows_columns[p]).collect(),
            None => rows_columns,
        };
        let spatial = self.config.head_dim() / 2;
        let inv = base_frequencies(self.config.rope_theta, spatial);
        let quarter = inv.len();
        Rope::of_angles(rows_columns.len(), spatial, device, |patch, i| {
            let (row, column) = rows_columns[patch];
            match i < quarter {
                true => row as f32 * inv[i],
                false => column as f32 * inv[i - quarter],
            }
        })
    }

    /// One block; its linear layers read `lora`'s adapters in [`Qwen2VlVisionBlock::linears`]
    /// order.
    fn block(
        &self,
        block: &Qwen2VlVisionBlock<B>,
        lora: Option<&BlockLora<B>>,
        x: Tensor<B, 2>,
        rope: &Rope<B>,
        segments: &[usize],
    ) -> Tensor<B, 2> {
        let attended = self.attention(block, lora, block.norm1.forward(x.clone()), rope, segments);
        let x = x + block_linear(&block.proj, lora, 1, attended);
        let h = block.norm2.forward(x.clone());
        let h = match &block.mlp {
            VisionMlp::TwoLayer(mlp) => {
                let h = block_linear(&mlp.fc1, lora, 2, h);
                let h = match self.config.activation {
                    Qwen2VlActivation::Gelu => gelu(h),
                    _ => quick_gelu(h),
                };
                block_linear(&mlp.fc2, lora, 3, h)
            }
            VisionMlp::Gated(mlp) => {
                let gate = block_linear(&mlp.gate_proj, lora, 2, h.clone())
                    .into_primitive()
                    .tensor();
                let up = block_linear(&mlp.up_proj, lora, 3, h).into_primitive().tensor();
                let hidden = Tensor::from_primitive(TensorPrimitive::Float(B::glu(gate, up, GateActivation::Silu)));
                block_linear(&mlp.down_proj, lora, 4, hidden)
            }
        };
        x + h
    }

    /// Multi-head attention of each patch over the patches of its own segment (its frame, or
    /// its window), queries and keys rotated by the patches' rows and columns: `[patches, embed]`
    /// (normed) → `[patches, embed]` before the output projection.
    fn attention(
        &self,
        block: &Qwen2VlVisionBlock<B>,
        lora: Option<&BlockLora<B>>,
        h: Tensor<B, 2>,
        rope: &Rope<B>,
        segments: &[usize],
    ) -> Tensor<B, 2> {
        let [count, e] = h.dims();
        let (heads, head_dim) = (self.config.num_heads, self.config.head_dim());
        let scale = (head_dim as f64).powf(-0.5);
        let qkv = block_linear(&block.qkv, lora, 0, h);
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
        attend_segments([q, k, v], segments, scale, QUERY_BLOCK)
    }
}

/// Bidirectional attention of each query over the keys of its own segment (`segments`: their
/// lengths, in order), `query_block` queries' scores at a time: `[1, heads, patches, head_dim]`
/// queries, keys and values → `[patches, heads · head_dim]`.
fn attend_segments<B: ReinBackend>(
    [q, k, v]: [Tensor<B, 4>; 3],
    segments: &[usize],
    scale: f64,
    query_block: usize,
) -> Tensor<B, 2> {
    let [_, heads, _, head_dim] = q.dims();
    let mut outputs = Vec::with_capacity(segments.len());
    let mut start = 0;
    for &len in segments {
        // At most `query_block` queries' scores at once: a frame of n patches would otherwise
        // hold n² of them per head (17 GB at Qwen2.5-VL's largest image, 65,536 patches).
        for first in (0..len).step_by(query_block) {
            let count = query_block.min(len - first);
            let per_head: Vec<Tensor<B, 2>> = (0..heads)
                .map(|head| {
                    let rows = |m: &Tensor<B, 4>, rows: std::ops::Range<usize>| {
                        let n = rows.len();
                        m.clone()
                            .slice([0..1, head..head + 1, rows, 0..head_dim])
                            .reshape([n, head_dim])
                    };
                    let queries = rows(&q, start + first..start + first + count);
                    let keys = rows(&k, start..start + len);
                    let scores = affine(queries, keys.transpose(), None).mul_scalar(scale);
                    affine(softmax(scores, 1), rows(&v, start..start + len), None)
                })
                .collect();
            outputs.push(Tensor::cat(per_head, 1));
        }
        start += len;
    }
    Tensor::cat(outputs, 0)
}

/// Qwen2.5-VL's windows: the merge blocks of every frame of `grids` (`(frames, rows, columns)`
/// of patches), numbered in the processor's order, listed window by window — windows of
/// `side × side` merge blocks tiling each frame row-major from its top left (the last ones cut
/// short), row-major within a window — and each window's length in patches.
fn window_order(grids: &[(usize, usize, usize)], merge: usize, side: usize) -> (Vec<usize>, Vec<usize>) {
    let (mut order, mut lengths) = (Vec::new(), Vec::new());
    let mut first = 0;
    for &(t, h, w) in grids {
        let (rows, columns) = (h / merge, w / merge);
        for frame in 0..t {
            let base = first + frame * rows * columns;
            for top in (0..rows).step_by(side) {
                for left in (0..columns).step_by(side) {
                    let before = order.len();
                    for r in top..(top + side).min(rows) {
                        order.extend((left..(left + side).min(columns)).map(|c| base + r * columns + c));
                    }
                    lengths.push((order.len() - before) * merge * merge);
                }
            }
        }
        first += t * rows * columns;
    }
    (order, lengths)
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
    fn attention_in_query_blocks_equals_attention_at_once() {
        let device = Default::default();
        let mut rng = rein_core::SeededRng::new(3);
        let [q, k, v] = [0, 1, 2].map(|_| crate::random::normal::<Flex>(&mut rng, [2 * 13, 8], 1.0, &device));
        let heads = |t: Tensor<Flex, 2>| t.reshape([1, 13 * 2, 2, 4]).swap_dims(1, 2);
        let attend = |block: usize| -> Vec<f32> {
            let parts = [heads(q.clone()), heads(k.clone()), heads(v.clone())];
            attend_segments(parts, &[19, 7], 0.5, block)
                .into_data()
                .to_vec()
                .unwrap()
        };
        let whole = attend(usize::MAX);
        assert_eq!(attend(4), whole);
        assert_eq!(attend(7), whole);
    }

    #[test]
    fn windows_tile_each_frame_from_its_top_left() {
        // 3 × 5 merge blocks (6 × 10 patches, merge 2) in windows of 2 × 2: two rows of three
        // windows, the last row and column cut short; then a 1 × 1 image of its own.
        let (order, lengths) = window_order(&[(1, 6, 10), (1, 2, 2)], 2, 2);
        assert_eq!(order, [0, 1, 5, 6, 2, 3, 7, 8, 4, 9, 10, 11, 12, 13, 14, 15]);
        assert_eq!(lengths, [16, 16, 8, 8, 8, 4, 4]);
    }

    #[test]
    fn configs_rein_cannot_run_are_refused_by_key() {
        let refuse = |v: Value| Qwen2VlVisionConfig::from_json(&v, Qwen2VlGeneration::Qwen2Vl).unwrap_err();
        assert!(refuse(serde_json::json!({"hidden_act": "silu"})).contains("hidden_act"));
        assert!(refuse(serde_json::json!({"embed_dim": 36, "num_heads": 6})).contains("divisible by 4"));
        assert!(refuse(serde_json::json!({"patch_size": 1000})).contains("vision_config.patch_size"));
        assert!(refuse(serde_json::json!({"depth": 0})).contains("vision_config.depth"));
        assert!(refuse(serde_json::json!({"in_channels": 1})).contains("in_channels"));
        let refuse = |v: Value| Qwen2VlVisionConfig::from_json(&v, Qwen2VlGeneration::Qwen2_5Vl).unwrap_err();
        assert!(refuse(serde_json::json!({"hidden_act": "quick_gelu"})).contains("(silu)"));
        assert!(refuse(serde_json::json!({"window_size": 20})).contains("vision_config.window_size"));
        assert!(
            refuse(serde_json::json!({"depth": 4, "fullatt_block_indexes": [1, 4]}))
                .contains("block 4 is not one of the 4")
        );
    }
}

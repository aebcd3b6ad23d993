//! The SigLIP vision transformer as Idefics3 / SmolVLM use it (transformers'
//! `Idefics3VisionTransformer`): each tile cut into `patch × patch` patches, each patch projected
//! (the checkpoint's convolution of stride `patch`, read as one matrix), a learned position
//! embedding per patch, pre-norm encoder layers (bidirectional multi-head attention and a
//! GELU MLP, both with biases, LayerNorms with biases), and a final LayerNorm.
//!
//! Attention runs one `(tile, head)` at a time through [`affine`]: the same summation order on
//! every instruction set, as rein's other products.

use burn::module::{Module, Param};
use burn::nn::{LayerNorm, LayerNormConfig, Linear};
use burn::tensor::activation::softmax;
use burn::tensor::{Int, Tensor, TensorData};
use rein_core::SeededRng;
use rein_gguf::GateActivation;
use serde_json::Value;

use super::vision_lora::{BlockLora, block_linear};
use crate::backend::{ReinBackend, affine};

/// A vision config's sizes (`vision_config` of `config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct VisionConfig {
    /// Width of the patch embeddings.
    pub hidden_size: usize,
    /// Width of each layer's MLP.
    pub intermediate_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Channels of the pixel values (3).
    pub num_channels: usize,
    /// The side of the square image the position embeddings cover.
    pub image_size: usize,
    /// The side of a patch.
    pub patch_size: usize,
    /// The LayerNorms' epsilon.
    pub layer_norm_eps: f64,
    /// The MLP's activation: `gelu_pytorch_tanh` or `gelu`.
    pub activation: VisionActivation,
}

/// The vision MLP's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VisionActivation {
    /// `gelu_pytorch_tanh`: GELU's tanh approximation.
    GeluTanh,
    /// `gelu`: GELU with `erf`.
    Gelu,
}

impl VisionConfig {
    /// The config `value` describes (transformers' `Idefics3VisionConfig`, with its defaults).
    pub fn from_json(value: &Value) -> Result<Self, String> {
        let size = |key: &str, default: u64| -> Result<usize, String> {
            match &value[key] {
                Value::Null => Ok(default as usize),
                v => match v.as_u64() {
                    Some(n) if n > 0 && n <= 1 << 20 => Ok(n as usize),
                    _ => Err(format!("vision_config.{key}: expected a positive integer, found {v}")),
                },
            }
        };
        let activation = match value["hidden_act"].as_str().unwrap_or("gelu_pytorch_tanh") {
            "gelu_pytorch_tanh" => VisionActivation::GeluTanh,
            "gelu" => VisionActivation::Gelu,
            other => {
                return Err(format!(
                    "vision_config.hidden_act: `{other}` is not supported (gelu_pytorch_tanh, gelu)"
                ));
            }
        };
        let config = Self {
            hidden_size: size("hidden_size", 1152)?,
            intermediate_size: size("intermediate_size", 3072)?,
            num_hidden_layers: size("num_hidden_layers", 12)?,
            num_attention_heads: size("num_attention_heads", 16)?,
            num_channels: size("num_channels", 3)?,
            image_size: size("image_size", 224)?,
            patch_size: size("patch_size", 32)?,
            layer_norm_eps: value["layer_norm_eps"].as_f64().unwrap_or(1e-6),
            activation,
        };
        if !config.hidden_size.is_multiple_of(config.num_attention_heads) {
            return Err(format!(
                "vision_config: hidden_size {} is not a multiple of num_attention_heads {}",
                config.hidden_size, config.num_attention_heads
            ));
        }
        if config.num_channels != 3 {
            return Err(format!(
                "vision_config.num_channels: {} (rein reads RGB images)",
                config.num_channels
            ));
        }
        if config.patch_size > config.image_size {
            return Err(format!(
                "vision_config: patch_size {} is larger than image_size {}",
                config.patch_size, config.image_size
            ));
        }
        Ok(config)
    }

    /// The config as `config.json`'s `vision_config` (what [`VisionConfig::from_json`] reads).
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "model_type": "idefics3_vision",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_channels": self.num_channels,
            "image_size": self.image_size,
            "patch_size": self.patch_size,
            "layer_norm_eps": self.layer_norm_eps,
            "hidden_act": match self.activation {
                VisionActivation::GeluTanh => "gelu_pytorch_tanh",
                VisionActivation::Gelu => "gelu",
            },
        })
    }

    /// Patches along one side of `image_size`: the position embeddings' grid.
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }
}

/// An encoder layer's linear layers, by their transformers paths within the layer, in the
/// order [`VisionLayer::linears`] gives them.
pub const LAYER_LINEARS: [&str; 6] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.out_proj",
    "mlp.fc1",
    "mlp.fc2",
];

/// One encoder layer.
#[derive(Module, Debug)]
pub struct VisionLayer<B: ReinBackend> {
    /// Before attention.
    pub layer_norm1: LayerNorm<B>,
    /// Queries, keys, values and the output projection.
    pub q_proj: Linear<B>,
    /// Keys.
    pub k_proj: Linear<B>,
    /// Values.
    pub v_proj: Linear<B>,
    /// The attention's output projection.
    pub out_proj: Linear<B>,
    /// Before the MLP.
    pub layer_norm2: LayerNorm<B>,
    /// The MLP's first layer.
    pub fc1: Linear<B>,
    /// The MLP's second layer.
    pub fc2: Linear<B>,
}

impl<B: ReinBackend> VisionLayer<B> {
    /// Its linear layers: `self_attn.{q,k,v,out}_proj`, `mlp.fc1`, `mlp.fc2`.
    pub fn linears(&self) -> [&Linear<B>; 6] {
        [
            &self.q_proj,
            &self.k_proj,
            &self.v_proj,
            &self.out_proj,
            &self.fc1,
            &self.fc2,
        ]
    }

    /// Its linear layers: `self_attn.{q,k,v,out}_proj`, `mlp.fc1`, `mlp.fc2`.
    pub fn linears_mut(&mut self) -> [&mut Linear<B>; 6] {
        [
            &mut self.q_proj,
            &mut self.k_proj,
            &mut self.v_proj,
            &mut self.out_proj,
            &mut self.fc1,
            &mut self.fc2,
        ]
    }
}

/// The vision transformer.
#[derive(Module, Debug)]
pub struct VisionEncoder<B: ReinBackend> {
    /// The patch projection, `[channels · patch², hidden]` (the convolution's kernel).
    pub patch_embedding: Linear<B>,
    /// One embedding per patch position, `[patches_per_side², hidden]`.
    pub position_embedding: Param<Tensor<B, 2>>,
    /// Encoder layers.
    pub layers: Vec<VisionLayer<B>>,
    /// After the last layer.
    pub post_layernorm: LayerNorm<B>,
    #[module(skip)]
    config: VisionConfig,
}

fn linear<B: ReinBackend>(layer: &Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    affine(x, layer.weight.val(), layer.bias.as_ref().map(|b| b.val()))
}

impl<B: ReinBackend> VisionEncoder<B> {
    /// An encoder of these parts (the patch projection as `[channels · patch², hidden]`,
    /// position embeddings `[patches_per_side², hidden]`), as a checkpoint holds them.
    pub fn from_parts(
        patch_embedding: Linear<B>,
        position_embedding: Param<Tensor<B, 2>>,
        layers: Vec<VisionLayer<B>>,
        post_layernorm: LayerNorm<B>,
        config: VisionConfig,
    ) -> Self {
        Self {
            patch_embedding,
            position_embedding,
            layers,
            post_layernorm,
            config,
        }
    }

    /// A new encoder of `config`, its weights drawn from `rng` as transformers initialises
    /// one: every matrix and the position embeddings `N(0, std²)`, biases zero, LayerNorms
    /// multiplying by one. Drawn in order: the patch projection, the position embeddings, then
    /// layer by layer q, k, v, out, fc1, fc2.
    pub fn init(config: VisionConfig, std: f64, rng: &mut SeededRng, device: &B::Device) -> Self {
        let (d, c, p) = (config.hidden_size, config.num_channels, config.patch_size);
        let linear = |rng: &mut SeededRng, input: usize, output: usize| Linear {
            weight: Param::from_tensor(crate::random::normal::<B>(rng, [input, output], std, device)),
            bias: Some(Param::from_tensor(Tensor::zeros([output], device))),
        };
        let norm = || LayerNormConfig::new(d).with_epsilon(config.layer_norm_eps).init(device);
        let patch_embedding = linear(rng, c * p * p, d);
        let positions = config.patches_per_side().pow(2);
        let position_embedding = Param::from_tensor(crate::random::normal::<B>(rng, [positions, d], std, device));
        let layers = (0..config.num_hidden_layers)
            .map(|_| VisionLayer {
                layer_norm1: norm(),
                q_proj: linear(rng, d, d),
                k_proj: linear(rng, d, d),
                v_proj: linear(rng, d, d),
                out_proj: linear(rng, d, d),
                layer_norm2: norm(),
                fc1: linear(rng, d, config.intermediate_size),
                fc2: linear(rng, config.intermediate_size, d),
            })
            .collect();
        Self {
            patch_embedding,
            position_embedding,
            layers,
            post_layernorm: norm(),
            config,
        }
    }

    /// The encoder's config.
    pub fn config(&self) -> &VisionConfig {
        &self.config
    }

    /// The last hidden states of whole square tiles (no padding).
    ///
    /// # Shapes
    /// - `pixel_values`: `[tiles, 3, side, side]` with `side` a multiple of the patch size →
    ///   `[tiles, (side / patch)², hidden]`
    pub fn forward(&self, pixel_values: Tensor<B, 4>) -> Tensor<B, 3> {
        self.forward_adapted(pixel_values, &[])
    }

    /// [`VisionEncoder::forward`] with `lora[i]`'s adapters on layer `i`'s linear layers (none
    /// past the end of `lora`).
    pub fn forward_adapted(&self, pixel_values: Tensor<B, 4>, lora: &[BlockLora<B>]) -> Tensor<B, 3> {
        let [tiles, _, side, _] = pixel_values.dims();
        let per_side = side / self.config.patch_size;
        let d = self.config.hidden_size;
        let x = linear(&self.patch_embedding, self.patches(pixel_values));
        let ids = position_ids(per_side, self.config.patches_per_side());
        let count = ids.len();
        let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [count]), &x.device());
        let positions = self.position_embedding.val().select(0, ids);
        let mut x = x.reshape([tiles, count, d]) + positions.unsqueeze::<3>();
        for (i, layer) in self.layers.iter().enumerate() {
            x = self.layer(layer, lora.get(i), x);
        }
        self.post_layernorm.forward(x)
    }

    /// Each tile's patches in row-major order, each flattened channel-first:
    /// `[tiles, 3, side, side]` → `[tiles · patches, 3 · patch²]`.
    fn patches(&self, pixel_values: Tensor<B, 4>) -> Tensor<B, 2> {
        let [tiles, c, side, _] = pixel_values.dims();
        let p = self.config.patch_size;
        let n = side / p;
        pixel_values
            .reshape([tiles, c, n, p, n, p])
            .permute([0, 2, 4, 1, 3, 5])
            .reshape([tiles * n * n, c * p * p])
    }

    fn layer(&self, layer: &VisionLayer<B>, lora: Option<&BlockLora<B>>, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [tiles, seq, d] = x.dims();
        let h = layer.layer_norm1.forward(x.clone()).reshape([tiles * seq, d]);
        let attended = self.attention(layer, lora, h, tiles, seq);
        let x = x + block_linear(&layer.out_proj, lora, 3, attended).reshape([tiles, seq, d]);
        let h = layer.layer_norm2.forward(x.clone()).reshape([tiles * seq, d]);
        let h = block_linear(&layer.fc1, lora, 4, h);
        let h = match self.config.activation {
            VisionActivation::GeluTanh => {
                let ones = Tensor::ones_like(&h);
                Tensor::from_primitive(burn::tensor::TensorPrimitive::Float(B::glu(
                    h.into_primitive().tensor(),
                    ones.into_primitive().tensor(),
                    GateActivation::GeluTanh,
                )))
            }
            VisionActivation::Gelu => burn::tensor::activation::gelu(h),
        };
        x + block_linear(&layer.fc2, lora, 5, h).reshape([tiles, seq, d])
    }

    /// Multi-head attention of every patch of a tile over all of that tile's patches:
    /// `[tiles · seq, hidden]` (normed) → `[tiles · seq, hidden]` before the output projection.
    fn attention(
        &self,
        layer: &VisionLayer<B>,
        lora: Option<&BlockLora<B>>,
        h: Tensor<B, 2>,
        tiles: usize,
        seq: usize,
    ) -> Tensor<B, 2> {
        let heads = self.config.num_attention_heads;
        let head_dim = self.config.hidden_size / heads;
        let scale = (head_dim as f64).powf(-0.5);
        let [q, k, v] = [0, 1, 2].map(|slot| block_linear(layer.linears()[slot], lora, slot, h.clone()));
        let mut rows = Vec::with_capacity(tiles);
        for t in 0..tiles {
            let tile = |m: &Tensor<B, 2>| m.clone().narrow(0, t * seq, seq);
            let (q, k, v) = (tile(&q), tile(&k), tile(&v));
            let per_head: Vec<Tensor<B, 2>> = (0..heads)
                .map(|head| {
                    let columns = head * head_dim..(head + 1) * head_dim;
                    let part = |m: &Tensor<B, 2>| m.clone().slice([0..seq, columns.clone()]);
                    let scores = affine(part(&q), part(&k).transpose(), None).mul_scalar(scale);
                    affine(softmax(scores, 1), part(&v), None)
                })
                .collect();
            rows.push(Tensor::cat(per_head, 1));
        }
        Tensor::cat(rows, 0)
    }
}

/// The position embedding of each patch of a whole tile `per_side` patches wide, on a grid of
/// `grid` per side, as `Idefics3VisionEmbeddings` buckets them: patch `i`'s fraction
/// `i · (1 / per_side)` (in `f32`, capped below 1) counts the boundaries `k / grid` at or
/// below it (`torch.arange(1 / grid, 1, 1 / grid)`, in `f64` rounded to `f32`). The identity
/// when the tile has the grid's size.
fn position_ids(per_side: usize, grid: usize) -> Vec<i64> {
    let step = 1.0 / grid as f64;
    let boundaries: Vec<f32> = (0..)
        .map(|k| (step + step * f64::from(k)) as f32)
        .take_while(|&b| f64::from(b) < 1.0)
        .collect();
    let bucket = |i: usize| -> i64 {
        let fraction = (i as f32 * (1.0 / per_side as f32)).min((1.0 - 1e-6) as f32);
        boundaries.iter().filter(|&&b| b <= fraction).count() as i64
    };
    (0..per_side)
        .flat_map(|row| (0..per_side).map(move |col| (row, col)))
        .map(|(row, col)| bucket(row) * grid as i64 + bucket(col))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tile_of_the_grid_size_reads_every_position_once() {
        for grid in [4, 26, 27, 32] {
            let ids = position_ids(grid, grid);
            assert_eq!(ids, (0..(grid * grid) as i64).collect::<Vec<_>>(), "grid {grid}");
        }
    }

    #[test]
    fn a_smaller_tile_spreads_over_the_grid() {
        // Two patches per side on a 4-wide grid: fractions 0 and 0.5 fall in buckets 0 and 2.
        assert_eq!(position_ids(2, 4), vec![0, 2, 8, 10]);
        // torch's buckets for tiles of 13 and 7 patches on grids of 27 and 26.
        assert_eq!(position_ids(13, 27)[..13], (0..13).map(|i| 2 * i).collect::<Vec<i64>>());
        assert_eq!(position_ids(7, 26)[..7], [0, 3, 7, 11, 14, 18, 22]);
    }

    #[test]
    fn configs_rein_cannot_run_are_refused_by_key() {
        let refuse = |v: Value| VisionConfig::from_json(&v).unwrap_err();
        assert!(refuse(serde_json::json!({"hidden_act": "quick_gelu"})).contains("hidden_act"));
        assert!(
            refuse(serde_json::json!({"hidden_size": 30, "num_attention_heads": 4})).contains("num_attention_heads")
        );
        assert!(refuse(serde_json::json!({"patch_size": 0})).contains("vision_config.patch_size"));
        assert!(refuse(serde_json::json!({"num_channels": 1})).contains("num_channels"));
    }
}

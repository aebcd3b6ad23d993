//! LoRA adapters on a vision encoder (`[lora] vision = true`): every linear layer of each
//! encoder block's attention and MLP carries a [`Lora`], as PEFT adapts the vision tower's
//! modules its `target_modules` selects (`model.vision_model.encoder.layers.{i}.self_attn.q_proj`
//! in Idefics3, `model.visual.blocks.{i}.attn.qkv` in Qwen2-VL). The encoder's own weights stay
//! frozen with the rest of the base model; the patch embedding, the position embeddings and the
//! connector (Idefics3's projection, Qwen2-VL's merger) carry no adapter.
//!
//! The adapters live beside the encoder in its image side ([`BlockLora`] per block), so that
//! freezing the encoder never freezes them, and each block's forward pass reads its own.

use burn::module::{Module, Param};
use burn::nn::Linear;
use burn::tensor::Tensor;
use rein_core::{ModelDtype, SeededRng};

use crate::backend::ReinBackend;
use crate::lm::lora::{Lora, LoraSpec, adapted};

/// One encoder block's adapters: one per linear layer, in the order the block lists them.
#[derive(Module, Debug)]
pub struct BlockLora<B: ReinBackend> {
    /// The adapter of each linear layer (`None`: not adapted).
    pub adapters: Vec<Option<Lora<B>>>,
}

/// Where the vision adapters' dropout streams start: past every decoder adapter's place.
const FIRST_PLACE: u64 = 1 << 40;

impl<B: ReinBackend> BlockLora<B> {
    /// Fresh adapters (outputs unchanged, [`Lora::new`]) on every linear layer of each block,
    /// `blocks[i]` listing block `i`'s layers' `[in, out]`; the `A` factors drawn from `rng`,
    /// block by block.
    pub(crate) fn fresh(
        blocks: &[Vec<[usize; 2]>],
        spec: &LoraSpec,
        rng: &mut SeededRng,
        device: &B::Device,
    ) -> Vec<Self> {
        (blocks.iter().enumerate())
            .map(|(i, shapes)| BlockLora {
                adapters: (shapes.iter().enumerate())
                    .map(|(slot, &[input, output])| {
                        let place = FIRST_PLACE + (i * 8 + slot) as u64;
                        Some(Lora::new(input, output, spec, rng, device).at(place))
                    })
                    .collect(),
            })
            .collect()
    }

    /// The adapter on the block's `slot`-th linear layer.
    fn get(&self, slot: usize) -> Option<&Lora<B>> {
        self.adapters.get(slot).and_then(Option::as_ref)
    }
}

/// `x·W + b` of the `slot`-th linear layer of a block, plus its adapter's update when `lora`
/// (the block's adapters) has one.
///
/// # Shapes
/// - `x`: `[rows, in]` → `[rows, out]`
pub(crate) fn block_linear<B: ReinBackend>(
    layer: &Linear<B>,
    lora: Option<&BlockLora<B>>,
    slot: usize,
    x: Tensor<B, 2>,
) -> Tensor<B, 2> {
    adapted(layer, lora.and_then(|l| l.get(slot)), x, ModelDtype::F32)
}

/// `layers` (one block's linear layers, in its order) with the adapters of `lora` merged into
/// their weights (`W + (α/r)·A·B`, frozen).
pub(crate) fn merge_block<B: ReinBackend>(layers: Vec<&mut Linear<B>>, lora: &BlockLora<B>) {
    for (layer, adapter) in layers.into_iter().zip(&lora.adapters) {
        if let Some(adapter) = adapter {
            let weight = (layer.weight.val() + adapter.delta()).detach();
            layer.weight = Param::from_tensor(weight).set_require_grad(false);
        }
    }
}

/// Starts a training step's dropout masks of every adapter in `blocks`.
pub(crate) fn set_dropout_key<B: ReinBackend>(blocks: &[BlockLora<B>], key: u64) {
    for adapter in blocks.iter().flat_map(|b| b.adapters.iter().flatten()) {
        adapter.set_dropout_key(key);
    }
}

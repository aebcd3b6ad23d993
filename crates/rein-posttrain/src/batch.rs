//! A [`TokenBatch`] through the model: per-token log-probabilities, entropies, values and logits
//! of its completions, from one forward pass over its rows packed end to end
//! ([`ConcatenatedRows`]).

use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData};
use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, Context, Rope, Routing};

use crate::packed_rows::ConcatenatedRows;
use crate::token_batch::TokenBatch;

/// The final hidden state that predicts each completion token, `[predicted, hidden]`, computed
/// over the rows concatenated end to end ([`ConcatenatedRows`]): the same values as over the
/// padded batch, without computing the padding; for a mixture of experts, with its routing
/// (what it chose, its router probabilities, how often it differed from the sampler's).
/// `None` when the batch has no completion token.
fn completion_hidden<B: ReinBackend>(
    model: &CausalLm<B>,
    batch: &TokenBatch,
    device: &B::Device,
) -> Option<(Tensor<B, 2>, ConcatenatedRows, Option<Routing<B>>)> {
    let image_token = model.vision.as_ref().map(|v| v.image_token_id());
    let packed = ConcatenatedRows::new(batch, image_token, model.config().moe().is_none());
    if packed.predictors.is_empty() {
        return None;
    }
    let total = packed.tokens.len();
    // Multimodal positions (Qwen2-VL): one rotary row per packed token, read in order.
    let (rope, positions) = match packed.multimodal_positions(model, batch) {
        Some((cells, section)) => (
            Rope::multimodal(model.config(), &cells, section, device),
            (0..total as i64).collect(),
        ),
        None => (
            model.rope(batch.prompt_width + batch.completion_width, device),
            packed.positions.clone(),
        ),
    };
    let config = model.config();
    let routing = (config.moe()).map(|moe| packed.routing(batch, config.num_hidden_layers, moe.top_k));
    let ctx = Context {
        rope: &rope,
        positions: Tensor::from_data(TensorData::new(positions, [1, total]), device),
        padding: None,
        sequences: Some(&packed.sequences),
        fused: None,
        routing: routing.as_ref(),
    };
    let tokens = Tensor::from_data(TensorData::new(packed.tokens.clone(), [1, total]), device);
    let embeddings = match batch.images.iter().any(|i| !i.is_empty()) {
        true => packed.with_images(model, model.embed(tokens), batch, device),
        false => model.embed(tokens),
    };
    let hidden = model.hidden_of_embeddings(embeddings, &ctx, None);
    let width = hidden.dims()[2];
    let hidden = hidden
        .reshape([total, width])
        .select(0, int_index(&packed.predictors, device));
    Some((hidden, packed, routing))
}

fn int_index<B: ReinBackend>(values: &[i64], device: &B::Device) -> Tensor<B, 1, Int> {
    Tensor::from_data(TensorData::new(values.to_vec(), [values.len()]), device)
}

/// `1 / temperature`, the scale of the logits that sampling at `temperature` draws from (1 for
/// greedy decoding).
fn logit_scale(temperature: f32) -> f32 {
    if temperature != 1.0 && temperature > 0.0 {
        1.0 / temperature
    } else {
        1.0
    }
}

/// Per-token log-probabilities of the completion tokens under `softmax(logits / temperature)`,
/// and optionally the entropy of that distribution at each completion position. The model
/// runs over the rows concatenated end to end, without their padding and with what rows share
/// (a group's prompt, a tree's trunk) once: the same values as over the padded batch, each row
/// with its own copy of its prompt.
///
/// # Shapes
/// → `[rows, C]` each (0 at padding positions)
pub fn completion_log_probs<B: ReinBackend>(
    model: &CausalLm<B>,
    batch: &TokenBatch,
    temperature: f32,
    with_entropy: bool,
    device: &B::Device,
) -> (Tensor<B, 2>, Option<Tensor<B, 2>>) {
    let out = completion_outputs(model, batch, temperature, with_entropy, None, device);
    (out.log_prob, out.entropy)
}

/// What one forward pass of the policy gives for each completion token, `[rows, C]` each (0 at
/// padding positions).
pub struct CompletionOutputs<B: ReinBackend> {
    /// The token's log-probability under `softmax(logits / temperature)`.
    pub log_prob: Tensor<B, 2>,
    /// The entropy of that distribution, when asked for.
    pub entropy: Option<Tensor<B, 2>>,
    /// A value head's output on the same hidden state, when one was given.
    pub values: Option<Tensor<B, 2>>,
    /// A mixture of experts' routing in this pass (its load-balancing loss, how often it
    /// differed from the sampler's); `None` for a dense model.
    pub routing: Option<Routing<B>>,
}

/// [`completion_log_probs`], and a value head `[hidden, 1]` read on the same hidden states
/// (the state before each completion token), from one forward pass.
pub fn completion_outputs<B: ReinBackend>(
    model: &CausalLm<B>,
    batch: &TokenBatch,
    temperature: f32,
    with_entropy: bool,
    value_head: Option<Tensor<B, 2>>,
    device: &B::Device,
) -> CompletionOutputs<B> {
    let (rows, c) = (batch.rows, batch.completion_width);
    let Some((hidden, packed, routing)) = completion_hidden(model, batch, device) else {
        // No completion tokens at all: nothing to score.
        let zeros = || Tensor::zeros([rows, c], device);
        return CompletionOutputs {
            log_prob: zeros(),
            entropy: with_entropy.then(zeros),
            values: value_head.map(|_| zeros()),
            routing: None,
        };
    };
    let values = value_head.map(|head| per_slot(rein_model::affine(hidden.clone(), head, None), &packed, [rows, c]));
    let targets = packed.targets(batch);
    let out = model.log_prob_entropy(hidden, int_index(&targets, device), logit_scale(temperature));
    let out = Tensor::<B, 2>::zeros([rows * c, 2], device).select_assign(
        0,
        int_index(&packed.slots, device),
        out,
        IndexingUpdateOp::Add,
    );
    let log_prob = out.clone().narrow(1, 0, 1).reshape([rows, c]);
    let entropy = with_entropy.then(|| out.narrow(1, 1, 1).reshape([rows, c]));
    CompletionOutputs {
        log_prob,
        entropy,
        values,
        routing,
    }
}

/// A value head `[hidden, 1]` read on `trunk`'s final hidden state before each completion token
/// (a separate value model's decoder), `[rows, C]`, 0 at padding.
pub fn completion_values<B: ReinBackend>(
    trunk: &CausalLm<B>,
    head: Tensor<B, 2>,
    batch: &TokenBatch,
    device: &B::Device,
) -> Tensor<B, 2> {
    let shape = [batch.rows, batch.completion_width];
    match completion_hidden(trunk, batch, device) {
        Some((hidden, packed, _)) => per_slot(rein_model::affine(hidden, head, None), &packed, shape),
        None => Tensor::zeros(shape, device),
    }
}

/// One value per predicted completion token, `[predicted, 1]`, laid out `[rows, C]`.
fn per_slot<B: ReinBackend>(values: Tensor<B, 2>, packed: &ConcatenatedRows, [rows, c]: [usize; 2]) -> Tensor<B, 2> {
    let device = values.device();
    Tensor::<B, 2>::zeros([rows * c, 1], &device)
        .select_assign(0, int_index(&packed.slots, &device), values, IndexingUpdateOp::Add)
        .reshape([rows, c])
}

/// The logits over the whole vocabulary at each completion position, scaled by
/// `1 / temperature`, one row per completion token in `[rows, C]` order (padding left out); see
/// [`CompletionLogits::per_token`] to lay per-row values back out. Every row of vocabulary-wide
/// logits is kept: `completion tokens × vocab` floats, and their gradients.
pub fn completion_logits<B: ReinBackend>(
    model: &CausalLm<B>,
    batch: &TokenBatch,
    temperature: f32,
    device: &B::Device,
) -> CompletionLogits<B> {
    let [rows, width] = [batch.rows, batch.completion_width];
    let vocab = model.config().vocab_size;
    let Some((hidden, packed, _)) = completion_hidden(model, batch, device) else {
        return CompletionLogits {
            logits: Tensor::zeros([0, vocab], device),
            slots: Vec::new(),
            targets: Vec::new(),
            shape: [rows, width],
        };
    };
    let logits = model.logits(hidden.unsqueeze_dim(0)).squeeze_dim(0);
    let targets = packed.targets(batch);
    CompletionLogits {
        logits: logits.mul_scalar(logit_scale(temperature)),
        slots: packed.slots,
        targets,
        shape: [rows, width],
    }
}

/// [`completion_logits`]'s result.
pub struct CompletionLogits<B: ReinBackend> {
    /// `[completion tokens, vocab]`.
    pub logits: Tensor<B, 2>,
    /// Where each row goes in the batch's `[rows, C]` grid.
    slots: Vec<i64>,
    /// The completion token each row predicts.
    targets: Vec<i64>,
    shape: [usize; 2],
}

impl<B: ReinBackend> CompletionLogits<B> {
    /// One value per completion token (`[completion tokens]`, in [`Self::logits`]' row order)
    /// laid out as the batch's `[rows, C]` grid, 0 at padding.
    pub fn per_token(&self, values: Tensor<B, 1>) -> Tensor<B, 2> {
        let [rows, width] = self.shape;
        let device = values.device();
        if self.slots.is_empty() {
            return Tensor::zeros([rows, width], &device);
        }
        Tensor::<B, 1>::zeros([rows * width], &device)
            .select_assign(0, int_index(&self.slots, &device), values, IndexingUpdateOp::Add)
            .reshape([rows, width])
    }

    /// [`completion_log_probs`] from these logits: each completion token's log-probability and,
    /// when asked, the entropy at its position, `[rows, C]` each. The same numbers up to
    /// rounding (these go through burn's `log_softmax`, not the chunked head kernel).
    pub fn log_probs(&self, with_entropy: bool) -> (Tensor<B, 2>, Option<Tensor<B, 2>>) {
        let device = self.logits.device();
        let log_softmax = burn::tensor::activation::log_softmax(self.logits.clone(), 1);
        let predicted = self.targets.len();
        let targets = Tensor::<B, 2, Int>::from_data(TensorData::new(self.targets.clone(), [predicted, 1]), &device);
        let log_prob = self.per_token(log_softmax.clone().gather(1, targets).reshape([predicted]));
        let entropy = with_entropy.then(|| {
            let h = (log_softmax.clone().exp() * log_softmax)
                .sum_dim(1)
                .neg()
                .reshape([predicted]);
            self.per_token(h)
        });
        (log_prob, entropy)
    }
}

/// A 1-D tensor's values.
pub(crate) fn floats<B: burn::tensor::backend::Backend>(tensor: Tensor<B, 1>) -> Vec<f32> {
    tensor.into_data().convert::<f32>().to_vec().expect("f32 values")
}

/// The mean of `values` (0 when there are none).
pub(crate) fn mean(values: &[f32]) -> f64 {
    values.iter().map(|&v| f64::from(v)).sum::<f64>() / values.len().max(1) as f64
}

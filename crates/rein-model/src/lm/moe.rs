//! Mixture of experts (Qwen3-MoE): each token goes through the `k` experts its router ranks
//! highest, weighted by the router's probabilities; and the load-balancing loss of the Switch
//! Transformer (Fedus et al. 2021, eqs. 4–6) as transformers computes it.
//!
//! ```text
//! p      = softmax(x · W_router)                      [tokens, experts]
//! chosen = the k experts of highest p                 (a tie goes to the lower expert)
//! w      = p[chosen]           (÷ Σ p[chosen] with norm_topk_prob)
//! y      = Σ_{e ∈ chosen} w_e · FFN_e(x)              (each expert runs on its own tokens only)
//! aux    = E · Σ_e f_e · P_e,  f_e = share of all top-k choices (every MoE layer, every token)
//!                              that went to e, P_e = mean of p_e over the same tokens
//! ```
//!
//! **Router replay** (verl's and slime's R3): the experts chosen while sampling are recorded
//! ([`Routing::record`]) and the trainer's forward pass routes each token to the same experts
//! ([`Routing::replay`]), its weights still the trainer's router probabilities at those experts,
//! so the policy being trained is the one that sampled; [`Routing::disagreement`] counts the
//! tokens whose own top-k would have differed (also without replaying: [`Routing::compare`]).
//! A token the sampler never routed (the last one of a completion, which predicts nothing) is
//! marked [`UNROUTED`] and routed freely.

use std::sync::Mutex;

use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::activation::softmax;
use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData};

use super::feed_forward::{FeedForward, MlpProducts};
use crate::backend::{ReinBackend, linear};

/// A mixture-of-experts MLP: a router and the experts it chooses among.
#[derive(Module, Debug)]
pub struct MixtureOfExperts<B: ReinBackend> {
    /// The router `W_router`, `[hidden, experts]`, no bias (`mlp.gate` in transformers).
    pub gate: Linear<B>,
    /// The experts, each a gated MLP.
    pub experts: Vec<FeedForward<B>>,
    #[module(skip)]
    top_k: usize,
    #[module(skip)]
    norm_topk_prob: bool,
}

impl<B: ReinBackend> MixtureOfExperts<B> {
    /// Experts routed to by `gate`, `top_k` per token, their weights renormalised when
    /// `norm_topk_prob`.
    pub fn new(gate: Linear<B>, experts: Vec<FeedForward<B>>, top_k: usize, norm_topk_prob: bool) -> Self {
        Self {
            gate,
            experts,
            top_k,
            norm_topk_prob,
        }
    }

    /// Experts per token.
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Each token through its experts (see the module's doc), recording into `routing` or
    /// replaying from it; `expert(e)` says how expert `e` multiplies.
    ///
    /// # Shapes
    /// - `x`: `[tokens, hidden]` → `[tokens, hidden]`
    pub(crate) fn forward<'p>(
        &self,
        x: Tensor<B, 2>,
        expert: impl Fn(usize) -> MlpProducts<'p, B>,
        layer: usize,
        routing: Option<&Routing<B>>,
    ) -> Tensor<B, 2> {
        let [tokens, width] = x.dims();
        let (experts, k) = (self.experts.len(), self.top_k);
        let device = x.device();
        let probabilities = softmax(linear(&self.gate, x.clone()), 1);
        let values: Vec<f32> = probabilities
            .clone()
            .into_data()
            .convert::<f32>()
            .to_vec()
            .unwrap_or_default();
        let own = top_k(&values, experts, k);
        let recorded = routing.and_then(|r| r.recorded(layer, tokens * k));
        let chosen = match (routing, &recorded) {
            (Some(routing), Some(recorded)) if routing.follow => followed(recorded, &own, k, experts),
            _ => own.clone(),
        };
        if let Some(routing) = routing {
            let non_finite = values.iter().any(|p| !p.is_finite());
            routing.note(
                layer,
                &own,
                &chosen,
                recorded.as_deref(),
                k,
                probabilities.clone(),
                non_finite,
            );
        }
        let index = Tensor::<B, 2, Int>::from_data(
            TensorData::new(chosen.iter().map(|&e| i64::from(e)).collect::<Vec<_>>(), [tokens, k]),
            &device,
        );
        let mut weights = probabilities.gather(1, index);
        if self.norm_topk_prob {
            weights = weights.clone() / weights.sum_dim(1);
        }
        let weights = weights.reshape([tokens * k]);
        let mut out = Tensor::<B, 2>::zeros([tokens, width], &device);
        for (e, mlp) in self.experts.iter().enumerate() {
            // The (token, slot) pairs routed to expert `e`, in token order.
            let slots: Vec<i64> = (0..tokens * k)
                .filter(|&s| chosen[s] as usize == e)
                .map(|s| s as i64)
                .collect();
            if slots.is_empty() {
                continue;
            }
            let n = slots.len();
            let rows: Vec<i64> = slots.iter().map(|&s| s / k as i64).collect();
            let rows = Tensor::<B, 1, Int>::from_data(TensorData::new(rows, [n]), &device);
            let slots = Tensor::<B, 1, Int>::from_data(TensorData::new(slots, [n]), &device);
            let y = mlp.forward(x.clone().select(0, rows.clone()), expert(e));
            let w = weights.clone().select(0, slots).reshape([n, 1]);
            out = out.select_assign(0, rows, y * w, IndexingUpdateOp::Add);
        }
        out
    }
}

/// The experts of a token the sampler never routed ([`Routing::replay`] routes it freely).
pub const UNROUTED: u32 = u32::MAX;

/// The recorded experts, a token's own choice where the record has none for it (or names an
/// expert the layer does not have).
fn followed(recorded: &[u32], own: &[u32], k: usize, experts: usize) -> Vec<u32> {
    recorded
        .chunks_exact(k.max(1))
        .zip(own.chunks_exact(k.max(1)))
        .flat_map(|(r, o)| match r.iter().all(|&e| (e as usize) < experts) {
            true => r,
            false => o,
        })
        .copied()
        .collect()
}

/// The `k` experts of highest probability for each row of `probabilities` (`[rows, experts]`,
/// row-major), highest first, a tie to the lower expert; a non-finite probability ranks lowest.
pub fn top_k(probabilities: &[f32], experts: usize, k: usize) -> Vec<u32> {
    let mut chosen = Vec::with_capacity(probabilities.len() / experts.max(1) * k);
    let mut order: Vec<u32> = Vec::with_capacity(experts);
    for row in probabilities.chunks_exact(experts.max(1)) {
        let rank = |e: u32| {
            let p = row[e as usize];
            if p.is_finite() { p } else { f32::NEG_INFINITY }
        };
        order.clear();
        order.extend(0..experts as u32);
        order.sort_by(|&a, &b| rank(b).total_cmp(&rank(a)).then(a.cmp(&b)));
        chosen.extend_from_slice(&order[..k.min(experts)]);
    }
    chosen
}

/// What the MoE layers of one forward pass chose, and what they must choose (see the module's
/// doc). Shared by reference through [`super::Context::routing`]; each MoE layer notes its
/// choices as it runs.
#[derive(Debug)]
pub struct Routing<B: ReinBackend> {
    /// Per decoder layer, the experts recorded for each token (`tokens × k`, token-major);
    /// empty for a layer without a record.
    recorded: Vec<Vec<u32>>,
    /// Route by the record (replay), or only compare with it.
    follow: bool,
    noted: Mutex<Noted<B>>,
}

#[derive(Debug)]
struct Noted<B: ReinBackend> {
    /// Per MoE layer run: its decoder layer and the experts it used.
    chosen: Vec<(usize, Vec<u32>)>,
    /// Per MoE layer run: the router's probabilities (with gradients when training).
    probabilities: Vec<Tensor<B, 2>>,
    /// Experts per token in each layer run.
    top_k: Vec<usize>,
    /// Tokens whose own top-k set differed from the replayed one, and tokens compared.
    differing: usize,
    compared: usize,
    /// The first layer whose router gave a non-finite probability.
    non_finite: Option<usize>,
}

impl<B: ReinBackend> Default for Routing<B> {
    fn default() -> Self {
        Self::record()
    }
}

impl<B: ReinBackend> Routing<B> {
    /// Free routing, noted: what sampling uses to record the experts it chose.
    pub fn record() -> Self {
        Self::replay(Vec::new())
    }

    /// Every token of decoder layer `i` routed to the experts `chosen[i]` lists (`tokens × k`,
    /// token-major, as [`Routing::chosen`] gives them; a token marked [`UNROUTED`] routes
    /// freely); a layer with an empty or missing entry routes freely.
    pub fn replay(chosen: Vec<Vec<u32>>) -> Self {
        Self::with_record(chosen, true)
    }

    /// Free routing, with the tokens counted whose choice differs from `chosen` (as for
    /// [`Routing::replay`]): the trainer without router replay, measuring what it would change.
    pub fn compare(chosen: Vec<Vec<u32>>) -> Self {
        Self::with_record(chosen, false)
    }

    fn with_record(recorded: Vec<Vec<u32>>, follow: bool) -> Self {
        Self {
            recorded,
            follow,
            noted: Mutex::new(Noted {
                chosen: Vec::new(),
                probabilities: Vec::new(),
                top_k: Vec::new(),
                differing: 0,
                compared: 0,
                non_finite: None,
            }),
        }
    }

    fn noted(&self) -> std::sync::MutexGuard<'_, Noted<B>> {
        self.noted.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The experts recorded at `layer`, when there are exactly `len` of them.
    fn recorded(&self, layer: usize, len: usize) -> Option<Vec<u32>> {
        self.recorded
            .get(layer)
            .filter(|c| !c.is_empty() && c.len() == len)
            .cloned()
    }

    #[allow(clippy::too_many_arguments)]
    fn note(
        &self,
        layer: usize,
        own: &[u32],
        chosen: &[u32],
        recorded: Option<&[u32]>,
        k: usize,
        probabilities: Tensor<B, 2>,
        non_finite: bool,
    ) {
        let mut noted = self.noted();
        if let Some(recorded) = recorded {
            let same = |a: &[u32], b: &[u32]| {
                let (mut a, mut b) = (a.to_vec(), b.to_vec());
                a.sort_unstable();
                b.sort_unstable();
                a == b
            };
            let rows = own.chunks_exact(k.max(1)).zip(recorded.chunks_exact(k.max(1)));
            let rows: Vec<_> = rows.filter(|(_, r)| !r.contains(&UNROUTED)).collect();
            noted.differing += rows.iter().filter(|(a, b)| !same(a, b)).count();
            noted.compared += rows.len();
        }
        if non_finite && noted.non_finite.is_none() {
            noted.non_finite = Some(layer);
        }
        noted.chosen.push((layer, chosen.to_vec()));
        noted.probabilities.push(probabilities);
        noted.top_k.push(k);
    }

    /// Per decoder layer, the experts each token used (`tokens × k`, token-major), empty for
    /// dense layers: what [`Routing::replay`] takes. `layers` is the model's layer count.
    pub fn chosen(&self, layers: usize) -> Vec<Vec<u32>> {
        let mut by_layer = vec![Vec::new(); layers];
        for (layer, chosen) in &self.noted().chosen {
            if let Some(slot) = by_layer.get_mut(*layer) {
                slot.extend_from_slice(chosen);
            }
        }
        by_layer
    }

    /// `(tokens whose own top-k differed from the replayed experts, tokens replayed)`, over
    /// every MoE layer.
    pub fn disagreement(&self) -> (usize, usize) {
        let noted = self.noted();
        (noted.differing, noted.compared)
    }

    /// The first decoder layer whose router gave a non-finite probability, if any.
    pub fn non_finite_layer(&self) -> Option<usize> {
        self.noted().non_finite
    }

    /// The load-balancing loss over every MoE layer this pass ran (see the module's doc;
    /// transformers' `load_balancing_loss_func`): `E · Σ_e f_e · P_e`, with gradients through
    /// `P`. `None` when no MoE layer ran.
    pub fn load_balancing_loss(&self) -> Option<Tensor<B, 1>> {
        let noted = self.noted();
        let first = noted.probabilities.first()?;
        let experts = first.dims()[1];
        let device = first.device();
        let rows: usize = noted.probabilities.iter().map(|p| p.dims()[0]).sum();
        if rows == 0 {
            return None;
        }
        let mut counts = vec![0.0f32; experts];
        for (p, &k) in noted.probabilities.iter().zip(&noted.top_k) {
            let values: Vec<f32> = p.clone().into_data().convert::<f32>().to_vec().unwrap_or_default();
            for e in top_k(&values, experts, k) {
                counts[e as usize] += 1.0;
            }
        }
        let share = Tensor::<B, 1>::from_data(TensorData::new(counts, [experts]), &device).div_scalar(rows as f32);
        let mean = Tensor::cat(noted.probabilities.clone(), 0)
            .sum_dim(0)
            .reshape([experts])
            .div_scalar(rows as f32);
        Some((share * mean).sum().mul_scalar(experts as f32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_the_sampler_never_routed_follows_its_own_choice() {
        let recorded = [3, 1, UNROUTED, UNROUTED, 2, 9];
        let own = [0, 1, 2, 3, 0, 1];
        assert_eq!(
            followed(&recorded, &own, 2, 4),
            vec![3, 1, 2, 3, 0, 1],
            "9 is no expert of 4"
        );
    }

    #[test]
    fn top_k_ranks_highest_first_ties_to_the_lower_expert_and_nan_last() {
        let p = [0.1, 0.4, 0.4, 0.1, f32::NAN, 0.2, 0.3, 0.5];
        assert_eq!(top_k(&p, 4, 2), vec![1, 2, 3, 2]);
        assert_eq!(top_k(&p, 4, 3), vec![1, 2, 0, 3, 2, 1]);
    }
}

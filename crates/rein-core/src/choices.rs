//! The choices recipes make and the crates that implement them read: plain data, so the recipe
//! schema (`rein-recipe`) can name them without knowing burn.

use serde::{Deserialize, Serialize};

/// The nonlinearity between layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// `tanh`, CleanRL's choice for PPO.
    #[default]
    Tanh,
    /// `max(0, x)`.
    Relu,
}

/// What to do when a reward plugin fails on a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// Stop training with the plugin's error and the failing group.
    #[default]
    Fail,
    /// Count that plugin's score as 0 for the failing group, and log the error.
    Zero,
    /// Drop the failing group from this step, and log the error.
    Skip,
}

/// Advantage estimators for outcome rewards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AdvantageKind {
    /// Group-normalised (GRPO; see `std_scaling`).
    #[default]
    Group,
    /// Leave-one-out baseline.
    Rloo,
    /// REINFORCE++ global normalisation.
    #[serde(rename = "reinforce++")]
    ReinforcePp,
    /// GiGPO for multi-turn episodes: group-normalised episode advantages plus step-level
    /// advantages over turns that start from the same environment state.
    Gigpo,
    /// verl's `grpo_passk`: only each group's best completion learns, from its margin over
    /// the second best.
    #[serde(rename = "grpo_passk")]
    GrpoPassk,
    /// The pass@k paper's analytical advantages from which completions are correct.
    #[serde(rename = "pass_at_k")]
    PassAtK,
    /// PRIME's process advantages: the rewards' step scores and the outcome, each made relative
    /// within its group, summed into returns over each completion's tokens and whitened.
    Process,
}

/// How several rewards become one advantage (TRL's `multi_objective_aggregation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MultiObjectiveAggregation {
    /// Sum the weighted rewards, then normalise the sum as `advantage` and `std_scaling` say.
    #[default]
    SumThenNormalize,
    /// GDPO: normalise each reward within its group, sum the weighted z-scores, then whiten
    /// the sums over the batch.
    NormalizeThenSum,
}

/// How group-normalised advantages are scaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StdScaling {
    /// Divide by each group's standard deviation (GRPO).
    #[default]
    Group,
    /// Divide by the whole batch's standard deviation.
    Batch,
    /// Do not divide (Dr. GRPO).
    None,
}

/// Where the importance ratio is taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RatioLevel {
    /// One ratio per token (PPO, GRPO, DAPO).
    #[default]
    Token,
    /// One length-normalised ratio per completion (GSPO).
    Sequence,
}

/// What the GRPO family maximises per token, from the importance weight `w` and the advantage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ObjectiveKind {
    /// PPO's clipped surrogate `min(w Â, clip(w) Â)` (GRPO, DAPO, GSPO).
    #[default]
    Clip,
    /// The clipped weight, held constant, times `Â log π` (CISPO, MiniMax-M1).
    Cispo,
    /// A soft sigmoid gate on `w` in place of the clip (SAPO).
    Sapo,
}

/// How per-token losses become one number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Aggregation {
    /// Every completion token counts once (long completions weigh more).
    TokenMean,
    /// Average within each completion, then over completions.
    #[default]
    SeqMeanTokenMean,
    /// Sum within each completion, divided by the batch size times the maximum completion
    /// length (no length bias).
    SeqMeanTokenSumNorm,
}

/// Which estimator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KlEstimator {
    /// `−log r`.
    K1,
    /// `½ (log r)²`.
    K2,
    /// `r − 1 − log r`.
    #[default]
    K3,
}

/// Where a GRPO run's completions come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SamplerBackend {
    /// The in-process batched KV-cache sampler.
    #[default]
    Native,
    /// Inference servers over HTTP (`sampler.urls`).
    Http,
}

/// The dtype a language model's linear layers multiply in (`model.dtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelDtype {
    /// Full `f32` products: the weights and activations as they are.
    #[default]
    F32,
    /// bf16 products: at each linear layer of the decoder, its weight, bias and input rounded
    /// to bf16 (8-bit mantissa), the product accumulated in `f32` and rounded to bf16, then
    /// carried on in `f32`. Norms, attention, the head's log-probabilities and the loss stay
    /// `f32`; so do the weights themselves, which are what a trainer updates.
    Bf16,
}

/// How a language model trains (`train.precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainPrecision {
    /// `f32` throughout.
    #[default]
    F32,
    /// Mixed precision: `f32` master weights, gradients as applied and optimiser state, with
    /// the forward and backward passes' products in bf16 ([`ModelDtype::Bf16`]).
    Mixed,
}

/// How the native sampler multiplies by weights kept as quantised codes (a GGUF's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SamplerPrecision {
    /// As the trainer computes: the logits of the `f32` weights, bit for bit.
    #[default]
    Exact,
    /// Activations quantised to 8 bits per block and integer dot products, as llama.cpp does:
    /// faster and not exact. The trainer's log-probabilities stay exact; `train/mismatch_kl`
    /// measures the difference and `algorithm.correction` can correct for it.
    Q8,
}

/// The HTTP API inference servers speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerApi {
    /// SGLang's native `/generate` with `input_ids` and `/update_weights_from_disk` (also
    /// `rein serve`).
    #[default]
    Sglang,
    /// vLLM's `/v1/completions` with token-id prompts and `return_token_ids`; the policy is
    /// synced as a LoRA adapter (`/v1/load_lora_adapter`).
    Vllm,
}

/// What the trainer writes for the servers after an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PolicySync {
    /// The whole (LoRA-merged) model as safetensors.
    #[default]
    Model,
    /// Only the LoRA adapter, in PEFT's format.
    Adapter,
}

/// How the loss corrects for completions sampled by another policy than the trainer's (an
/// older version, or the same weights in another engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LagCorrection {
    /// None: the ratio's denominator is the sampler's log-probability (today's GRPO).
    #[default]
    None,
    /// Truncated importance sampling: the trainer's own log-probabilities are the ratio's
    /// denominator and each token's loss is weighted by `min(π_trainer/π_sampler, cap)`.
    Tis,
    /// IcePop: as TIS, but tokens whose `π_trainer/π_sampler` leaves `[low, high]` are masked
    /// out instead of weighted.
    Icepop,
}

/// Where PPO on a language model gets its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValueModel {
    /// A value model of its own: a decoder and a one-value head (TRL, OpenRLHF).
    #[default]
    Separate,
    /// A one-value head on the policy's last hidden states: one forward pass for both.
    Head,
}

/// The losses of the DPO family (TRL's `loss_type` names; equations in `rein_optim::dpo_loss`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DpoLossKind {
    /// DPO's `−log σ(β h)`.
    #[default]
    Sigmoid,
    /// SLiC's `max(0, 1 − β h)`.
    Hinge,
    /// IPO's squared distance of the per-token margin from `1/(2β)`.
    Ipo,
    /// Robust DPO, unbiased under a share `label_smoothing` of flipped labels.
    Robust,
}

/// A reward the host computes from the sampler's own statistics of each completion, with no
/// labels and no plugin (equations in `rein_sampler::TokenCertainty`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SamplerSignal {
    /// The mean self-certainty of the completion's tokens (Intuitor: Zhao et al. 2025,
    /// "Learning to Reason without External Rewards").
    SelfCertainty,
    /// Minus the mean entropy of the completion's token distributions (RENT: Prabhudesai et al.
    /// 2025, "Maximizing Confidence Alone Improves Reasoning").
    NegativeEntropy,
}

impl SamplerSignal {
    /// Its name in recipes and metrics.
    pub fn name(self) -> &'static str {
        match self {
            SamplerSignal::SelfCertainty => "self_certainty",
            SamplerSignal::NegativeEntropy => "negative_entropy",
        }
    }
}

/// A process reward model's conventions (a recipe's `[[reward]] prm = { … }`; Math-Shepherd's by
/// default; how they are read in `rein_sampler::PrmReward`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrmSettings {
    /// What ends a step in a completion (the completion is split at it; empty steps dropped).
    pub separator: String,
    /// What the model reads after each step: its last token is where the step is judged.
    pub tag: String,
    /// The token whose probability (against `bad`'s) is a step's score.
    pub good: String,
    /// The token it is weighed against.
    pub bad: String,
    /// How the steps' scores make the completion's: `min` (the weakest step), `mean`, `last`
    /// or `prod`.
    pub aggregate: PrmAggregate,
}

impl Default for PrmSettings {
    fn default() -> Self {
        Self {
            separator: "\n".into(),
            tag: " ки".into(),
            good: "+".into(),
            bad: "-".into(),
            aggregate: PrmAggregate::Min,
        }
    }
}

/// How a process reward model's step scores make one completion's score.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrmAggregate {
    /// The lowest step score: a chain is as good as its weakest step.
    #[default]
    Min,
    /// Their mean.
    Mean,
    /// The last step's.
    Last,
    /// Their product.
    Prod,
}

/// The losses of KTO on unpaired desirable/undesirable completions (TRL's `KTOConfig.loss_type`
/// names; equations in `rein_optim::kto_loss`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KtoLossKind {
    /// KTO's value function against the policy's KL from the reference (Ethayarajh et al. 2024,
    /// eq. 7).
    #[default]
    Kto,
    /// APO-zero's unpaired form: no KL term, desirable completions pushed up and undesirable
    /// ones down from the reference (D'Oosterlinck et al. 2024).
    ApoZeroUnpaired,
}

/// Difficulty-aware advantage weights (GRPO-LEAD, Zhang & Zuo 2025): the logistic weight
/// `w(ρ) = low + (high − low) / (1 + exp(steepness · (ρ − center)))` of a group's empirical
/// accuracy ρ (equations and use in `rein_optim::difficulty_weight`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DifficultyWeight {
    /// The weight as ρ → 1 (an easy prompt's correct answers).
    pub low: f32,
    /// The weight as ρ → 0 (a hard prompt's correct answers).
    pub high: f32,
    /// ρ₀, the accuracy at which the weight is halfway.
    pub center: f32,
    /// k, how sharply the weight falls around ρ₀.
    pub steepness: f32,
}

impl Default for DifficultyWeight {
    fn default() -> Self {
        Self {
            low: 0.4,
            high: 1.5,
            center: 0.75,
            steepness: 10.0,
        }
    }
}

/// The adaptive entropy coefficient's settings (Skywork-OR1, He et al. 2025; TRL's
/// `use_adaptive_entropy`): each update the coefficient moves by `delta` toward keeping the mean
/// token entropy above `target`, within `[min, max]` (the controller is
/// `rein_optim::EntropyCoefficient`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AdaptiveEntropy {
    /// The mean token entropy (nats) at or below which the bonus applies and grows.
    pub target: f64,
    /// How much the coefficient moves per update.
    pub delta: f64,
    /// The smallest coefficient.
    pub min: f64,
    /// The largest coefficient.
    pub max: f64,
}

impl Default for AdaptiveEntropy {
    /// TRL's defaults.
    fn default() -> Self {
        Self {
            target: 0.2,
            delta: 0.005,
            min: 0.0,
            max: 1.0,
        }
    }
}

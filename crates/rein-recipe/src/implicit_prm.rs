//! PRIME's implicit process reward model inside a GRPO run (`[implicit_prm]`; verl's
//! `recipe/prime`, its `reward_model` keys): a second causal LM, trained online on the outcome
//! labels, whose per-token log-ratio to a frozen reference is a source of token rewards for the
//! process advantage. Its section, with verl's defaults, and its rules.

use rein_core::AdvantageKind;
use serde::{Deserialize, Serialize};

use crate::error::{Broken, broken};

/// The implicit PRM's settings (see the module docs). verl's names in brackets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImplicitPrmSection {
    /// The model it starts from, also its frozen reference (`model.path`, `model.ref_path`): a
    /// causal LM sharing the policy's tokenizer. Default: the policy as the online stage starts
    /// (after its SFT stage), as PRIME starts both from the SFT model.
    pub model: Option<String>,
    /// β of the implicit reward `β·log(π_φ/π_ref)`, in its loss and its token rewards
    /// (`beta_train`).
    pub beta: f64,
    /// AdamW's learning rate for the implicit PRM, constant (`optim.lr`).
    pub lr: f64,
    /// Its global gradient clipping (`optim.grad_clip`).
    pub max_grad_norm: f32,
    /// When it learns from a step's completions (`model.update`).
    pub update: ImplicitPrmUpdate,
    /// The weight of its token rewards in the process advantage, beside
    /// `algorithm.process_outcome_weight` (`algorithm.reward_dpo_coef` against
    /// `reward_gt_coef`; PRIME weighs the two alike).
    pub weight: f32,
    /// λ of the token rewards' returns: 0 rewards each token with its own `β·q`; above 0 each
    /// token's reward is the λ-discounted sum of those after it (`lambda`).
    pub lambda: f32,
    /// With `lambda > 0`, the last token's `β·q` is replaced so that the completion's rewards
    /// sum to its outcome label (`prime_use_gt`).
    pub use_outcome: bool,
}

impl Default for ImplicitPrmSection {
    fn default() -> Self {
        Self {
            model: None,
            beta: 0.05,
            lr: 1e-6,
            max_grad_norm: 10.0,
            update: ImplicitPrmUpdate::Before,
            weight: 1.0,
            lambda: 0.0,
            use_outcome: false,
        }
    }
}

/// When the implicit PRM learns from a step's completions, relative to rewarding them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImplicitPrmUpdate {
    /// It learns from them, then rewards them (two forward passes; verl's default).
    #[default]
    Before,
    /// It rewards them with the forward pass it learns from (one forward pass; the rewards are
    /// those of the model before the update).
    After,
    /// It never learns: a fixed implicit PRM (from `model`) rewards the completions.
    None,
}

/// The rules of a GRPO recipe's `[implicit_prm]`, `section`, when its advantage is `advantage`.
pub(crate) fn check(section: Option<&ImplicitPrmSection>, advantage: AdvantageKind) -> Result<(), Broken> {
    let Some(prm) = section else {
        return Ok(());
    };
    if advantage != AdvantageKind::Process {
        return Err(broken(
            "implicit_prm",
            "its token rewards are a source of the process advantage: set algorithm.advantage = \"process\"",
        ));
    }
    if !(prm.beta > 0.0 && prm.beta.is_finite()) {
        return Err(broken("implicit_prm.beta", format!("must be > 0, got {}", prm.beta)));
    }
    if !(prm.lr > 0.0 && prm.lr.is_finite()) {
        return Err(broken("implicit_prm.lr", format!("must be > 0, got {}", prm.lr)));
    }
    if !(prm.max_grad_norm > 0.0 && prm.max_grad_norm.is_finite()) {
        return Err(broken(
            "implicit_prm.max_grad_norm",
            format!("must be > 0, got {}", prm.max_grad_norm),
        ));
    }
    if !prm.weight.is_finite() {
        return Err(broken(
            "implicit_prm.weight",
            format!("must be finite, got {}", prm.weight),
        ));
    }
    if !(0.0..=1.0).contains(&prm.lambda) {
        return Err(broken(
            "implicit_prm.lambda",
            format!("must be in [0, 1], got {}", prm.lambda),
        ));
    }
    if prm.use_outcome && prm.lambda == 0.0 {
        return Err(broken(
            "implicit_prm.use_outcome",
            "is read only with lambda > 0 (with λ = 0 each token keeps its own reward)",
        ));
    }
    if prm.update == ImplicitPrmUpdate::None && prm.model.is_none() {
        return Err(broken(
            "implicit_prm.update",
            "`none` never trains it, and without `model` it starts as the policy, equal to its reference: \
             every token reward would be 0",
        ));
    }
    Ok(())
}

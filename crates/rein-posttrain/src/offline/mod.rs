//! Learners on fixed data, one file each beside its paper: supervised fine-tuning ([`sft`]),
//! DPO and its variants on preference pairs ([`dpo`], the losses in `rein_optim::preference`),
//! and reward-model training on pairs ([`reward_model`], Bradley–Terry).

pub mod dpo;
pub mod reward_model;
pub mod sft;

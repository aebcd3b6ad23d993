//! Learners on fixed data, one file each beside its paper: supervised fine-tuning ([`sft`]),
//! DPO and its variants on preference pairs ([`dpo`], the losses in `rein-optim`'s `dpo.rs`),
//! KTO on labelled completions ([`kto`], the losses in `rein-optim`'s `kto.rs`),
//! and reward-model training on pairs ([`reward_model`], the loss in `rein-optim`'s
//! `bradley_terry.rs`).

pub mod dpo;
pub mod kto;
pub mod reward_model;
pub mod sft;

//! Learners on fixed data, one file each beside its paper: supervised fine-tuning ([`sft`]),
//! DPO and its variants on preference pairs ([`dpo`], the losses in `rein-optim`'s `dpo.rs`),
//! KTO on labelled completions ([`kto`], the losses in `rein-optim`'s `kto.rs`),
//! reward-model training on pairs ([`reward_model`], the loss in `rein-optim`'s
//! `bradley_terry.rs`) and process-reward-model training on step labels
//! ([`process_reward_model`], the loss in `rein-optim`'s `step_labels.rs`).

pub mod dpo;
pub mod kto;
pub mod process_reward_model;
pub mod reward_model;
pub mod sft;

/// The reference's values of the examples `picked` (log-probabilities: the reference is
/// frozen, so they never change): with `keep`, those in `cache` reused and the others computed in
/// one call of `compute` (each example once) and kept; without, all computed.
pub(crate) fn reference_values<T: Copy>(
    cache: &mut [Option<T>],
    picked: &[usize],
    keep: bool,
    compute: impl FnOnce(&[usize]) -> Vec<T>,
) -> Vec<T> {
    if !keep {
        return compute(picked);
    }
    let mut missing: Vec<usize> = picked.iter().copied().filter(|&i| cache[i].is_none()).collect();
    missing.sort_unstable();
    missing.dedup();
    if !missing.is_empty() {
        for (&i, value) in missing.iter().zip(compute(&missing)) {
            cache[i] = Some(value);
        }
    }
    picked.iter().map(|&i| cache[i].expect("computed above")).collect()
}

/// The update every offline learner ends its step with: `grads` clipped to a global norm of
/// `max_grad_norm` (a non-finite norm stops the run, naming the first tensor that has one), then
/// one step of `optim` on `model` at the rate `lr`. Returns the stepped model and the norm
/// before clipping.
pub(crate) fn clipped_step<B, M, O>(
    model: M,
    optim: &mut O,
    mut grads: burn::optim::GradientsParams,
    (step, lr): (usize, f64),
    max_grad_norm: f32,
) -> Result<(M, f32), rein_run::RunError>
where
    B: burn::tensor::backend::AutodiffBackend,
    M: burn::module::AutodiffModule<B>,
    O: burn::optim::Optimizer<M, B>,
{
    let grad_norm = rein_optim::clip_grad_norm(&model, &mut grads, max_grad_norm);
    rein_run::RunError::check_gradients(step, grad_norm, || rein_optim::non_finite_gradient(&model, &grads))?;
    Ok((optim.step(lr, model, grads), grad_norm))
}

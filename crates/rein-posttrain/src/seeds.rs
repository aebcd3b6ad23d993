//! The seeds every learner draws from: the sampler's for each round of each step, and LoRA
//! dropout's keys, set apart from them.

/// Sets LoRA dropout's keys apart from the sampler's seeds.
pub(crate) const DROPOUT_SALT: u64 = 0xD80F_0A7C;

/// The sampler's seed for round `round` of step `step` (and LoRA dropout's key, from another
/// `seed`, for update `round` of a step): distinct for every (step, round).
pub(crate) fn generation_seed(seed: u64, step: usize, round: usize) -> u64 {
    let mix = |mut z: u64| {
        // SplitMix64's finaliser.
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    mix(mix(seed ^ mix(step as u64)) ^ round as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_seeds_never_collide_across_steps_and_rounds() {
        let mut seen = std::collections::HashSet::new();
        for step in 1..=500 {
            for round in 0..=40 {
                assert!(
                    seen.insert(generation_seed(1, step, round)),
                    "step {step} round {round}"
                );
            }
        }
    }
}

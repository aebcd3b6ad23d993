//! rein's samplers: drawing actions from policy outputs (and, later, tokens from language
//! models), with the log-probabilities and entropies the losses need.
//!
//! Sampling happens on the host from plain `f32` rows with a seeded [`SeededRng`], so a run is
//! reproducible on any backend; log-probabilities and entropies used in losses are burn tensor
//! functions so gradients flow through them.
//!
//! **Architecture invariant:** no knowledge of environments, plugins or training loops.

mod categorical;
mod gaussian;
mod rng;

pub use categorical::{categorical_entropy, categorical_log_prob, sample_categorical};
pub use gaussian::{gaussian_entropy, gaussian_log_prob, sample_gaussian};
pub use rng::SeededRng;

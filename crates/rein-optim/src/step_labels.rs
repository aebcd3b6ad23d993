//! Process reward models trained on step labels (Uesato et al. 2022, "Solving math word problems
//! with process- and outcome-based feedback"; Lightman et al. 2023, "Let's Verify Step by Step";
//! TRL's `PRMTrainer`): a token classifier reads a solution, and at the last token of each step
//! predicts whether the step is right. The loss is the cross entropy of those predictions,
//! averaged over the labelled tokens `T` (every other token carries no label):
//!
//! ```text
//! L = −(1/|T|) Σ_{t∈T} log softmax(z_t)[y_t]        y_t ∈ {0, 1}: the step ending at t is right
//! ```
//!
//! as transformers' `ForTokenClassification` loss computes it with every unlabelled token at
//! `-100`.

use burn::tensor::activation::log_softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

/// The step-label loss (see the module docs) of the logits at the labelled tokens, one row each,
/// and their labels.
///
/// # Shapes
/// - `logits`: `[labelled, num_labels]`, `labels`: `labelled` → `[1]`
///
/// # Panics
/// When `labels` and the logits' rows differ in number, or there are none.
pub fn step_label_loss<B: Backend>(logits: Tensor<B, 2>, labels: &[usize]) -> Tensor<B, 1> {
    let [rows, _] = logits.dims();
    assert!(
        rows > 0 && rows == labels.len(),
        "{rows} rows of logits for {} labels",
        labels.len()
    );
    let device = logits.device();
    let ids: Vec<i64> = labels.iter().map(|&label| label as i64).collect();
    let ids = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [rows, 1]), &device);
    log_softmax(logits, 1).gather(1, ids).mean().neg()
}

/// The share of `labels` that the logits' highest column predicts (`argmax`, the first on a
/// tie, as NumPy's); `None` without labels.
pub fn step_label_accuracy(logits: &[f32], num_labels: usize, labels: &[usize]) -> Option<f64> {
    if labels.is_empty() || num_labels == 0 {
        return None;
    }
    let predicted = logits
        .chunks_exact(num_labels)
        .map(|row| (row.iter().enumerate()).fold(0, |best, (i, &z)| if z > row[best] { i } else { best }));
    let right = predicted.zip(labels).filter(|(p, y)| p == *y).count();
    Some(right as f64 / labels.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    type T = burn::backend::Flex;

    fn logits(rows: &[[f32; 2]]) -> Tensor<T, 2> {
        let flat: Vec<f32> = rows.iter().flatten().copied().collect();
        Tensor::from_data(TensorData::new(flat, [rows.len(), 2]), &Default::default())
    }

    #[test]
    fn the_loss_is_the_mean_negative_log_likelihood_of_the_labels() {
        let loss = step_label_loss(logits(&[[0.0, 2.0], [1.0, -1.0], [0.5, 0.5]]), &[1, 1, 0]);
        let nll = |z: [f64; 2], y: usize| -(z[y] - (z[0].exp() + z[1].exp()).ln());
        let want = (nll([0.0, 2.0], 1) + nll([1.0, -1.0], 1) + nll([0.5, 0.5], 0)) / 3.0;
        assert!((f64::from(loss.into_scalar()) - want).abs() < 1e-6);
    }

    #[test]
    fn accuracy_counts_argmax_hits() {
        let flat = [0.0, 2.0, 1.0, -1.0, 0.5, 0.5];
        assert_eq!(step_label_accuracy(&flat, 2, &[1, 1, 0]), Some(2.0 / 3.0));
        assert_eq!(step_label_accuracy(&[], 2, &[]), None);
    }
}

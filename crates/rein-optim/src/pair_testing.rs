//! What the tests of the pairwise losses (DPO's, Bradley–Terry's) share: 1-D tensors from
//! values, a scalar back, and `log σ` in f64 to write the losses out by hand.

use burn::tensor::Tensor;

type T = burn::backend::Flex;

/// A 1-D tensor of `values`.
pub(crate) fn t(values: &[f32]) -> Tensor<T, 1> {
    Tensor::from_data(
        burn::tensor::TensorData::new(values.to_vec(), [values.len()]),
        &Default::default(),
    )
}

/// A one-element tensor's value.
pub(crate) fn scalar(x: Tensor<T, 1>) -> f64 {
    f64::from(x.into_scalar())
}

/// `log σ(x)` in f64.
pub(crate) fn log_sigmoid(x: f64) -> f64 {
    -(1.0 + (-x).exp()).ln()
}

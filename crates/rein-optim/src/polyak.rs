//! Target networks by Polyak averaging (Lillicrap et al. 2015, DDPG; used by SAC and TD3):
//!
//! ```text
//! θ̄ ← τ θ + (1 − τ) θ̄
//! ```
//!
//! for every float parameter of the target, matched by position with the online network's
//! (the two are the same module type, so their parameters are visited in the same order).

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// `target ← τ · online + (1 − τ) · target`, parameter by parameter; the target keeps its
/// parameter ids and whether each tracks gradients (the average itself is not part of any
/// graph).
///
/// # Panics
/// If `online` and `target` have different parameter counts or shapes (they are meant to be
/// two instances of one network).
pub fn polyak_update<B: Backend, M: Module<B>>(target: M, online: &M, tau: f64) -> M {
    struct Collect<B: Backend>(Vec<Tensor<B, 1>>);
    impl<B: Backend> ModuleVisitor<B> for Collect<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let value = param.val();
            let n = value.shape().num_elements();
            self.0.push(value.reshape([n]));
        }
    }
    struct Average<B: Backend> {
        online: std::vec::IntoIter<Tensor<B, 1>>,
        tau: f64,
    }
    impl<B: Backend> ModuleMapper<B> for Average<B> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, target, mapper) = param.consume();
            let online = self.online.next().expect("online and target have the same parameters");
            let online: Tensor<B, D> = online.reshape(target.shape());
            let tracked = target.is_require_grad();
            let averaged = (online * self.tau + target * (1.0 - self.tau)).detach();
            let averaged = if tracked { averaged.require_grad() } else { averaged };
            Param::from_mapped_value(id, averaged, mapper)
        }
    }
    let mut collect = Collect(Vec::new());
    online.visit(&mut collect);
    target.map(&mut Average {
        online: collect.0.into_iter(),
        tau,
    })
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::TensorData;

    use super::*;

    type B = Flex;

    fn filled(value: f32) -> Linear<B> {
        let device = Default::default();
        let mut linear = LinearConfig::new(2, 3).init::<B>(&device);
        linear.weight = Param::from_tensor(Tensor::from_data(TensorData::new(vec![value; 6], [2, 3]), &device));
        linear.bias = Some(Param::from_tensor(Tensor::from_data(
            TensorData::new(vec![value; 3], [3]),
            &device,
        )));
        linear
    }

    #[test]
    fn averages_every_parameter_and_keeps_the_target_ids() {
        let target = filled(1.0);
        let ids = (target.weight.id, target.bias.as_ref().map(|b| b.id));
        let updated = polyak_update(target, &filled(3.0), 0.25);
        // 0.25 · 3 + 0.75 · 1 = 1.5
        let weight: Vec<f32> = updated.weight.val().into_data().to_vec().unwrap();
        let bias: Vec<f32> = updated.bias.as_ref().unwrap().val().into_data().to_vec().unwrap();
        assert!(
            weight.iter().chain(&bias).all(|&x| (x - 1.5).abs() < 1e-6),
            "{weight:?} {bias:?}"
        );
        assert_eq!((updated.weight.id, updated.bias.as_ref().map(|b| b.id)), ids);
    }

    #[test]
    fn tau_one_copies_and_tau_zero_keeps() {
        let copy = polyak_update(filled(1.0), &filled(3.0), 1.0);
        let keep = polyak_update(filled(1.0), &filled(3.0), 0.0);
        let first = |l: &Linear<B>| -> f32 { l.weight.val().into_data().to_vec::<f32>().unwrap()[0] };
        assert_eq!((first(&copy), first(&keep)), (3.0, 1.0));
    }
}

//! An MLP kept in one flat `f32` buffer and run forward and backward by hand on rein-kernels'
//! products: no autodiff graph, no tensors, no allocation once its [`Trace`] has seen a batch
//! of the size. For the small networks of classic control (SAC, TD3 on a few hundred rows of
//! 64–256 units), where burn's per-operation bookkeeping costs more than the products.
//!
//! Each layer computes what rein's [`Mlp`](crate::Mlp) on the CPU computes, in the same
//! operations: `y = x·W + b` as one chain of fused multiply-adds per element starting from the
//! bias; in the backward pass `∂x = ∂y·Wᵀ`, `∂W = xᵀ·∂y` and `∂b = Σ_rows ∂y` in row order; ReLU
//! passes the gradient where its output is positive, tanh multiplies it by `1 − y²`. So its
//! values and gradients equal the module's (tested against burn's autodiff), and like rein's
//! kernels they are the same bits on every instruction set.
//!
//! The buffer holds each layer's weight `[in, out]` (row-major), then its bias `[out]`, layer
//! after layer.

use rein_core::Activation;
use rein_kernels::{Init, Isa, MatRef, matmul, matmul_bias};

use crate::safetensors_file::Tensors;

/// An MLP's shape, activation and parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct FlatMlp {
    /// `[input, hidden…, output]`.
    widths: Vec<usize>,
    activation: Activation,
    params: Vec<f32>,
}

/// What a forward pass keeps for the backward pass (each layer's input and the output), and the
/// backward pass's gradients. One per use site, reused from batch to batch.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    rows: usize,
    /// `acts[0]`: the input; `acts[l + 1]`: layer `l`'s output, after its activation.
    acts: Vec<Vec<f32>>,
    /// The gradient with respect to the output, then (after a backward pass asked for it) with
    /// respect to the input.
    grad: Vec<f32>,
    scratch: Vec<f32>,
}

impl Trace {
    /// The input of a batch of `rows` for `mlp`, to fill before [`FlatMlp::forward`].
    pub fn input(&mut self, mlp: &FlatMlp, rows: usize) -> &mut [f32] {
        self.rows = rows;
        self.acts.resize_with(mlp.widths.len(), Vec::new);
        for (act, width) in self.acts.iter_mut().zip(&mlp.widths) {
            act.resize(rows * width, 0.0);
        }
        &mut self.acts[0]
    }

    /// Rows in the batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The last forward pass's output, `[rows, output]`.
    pub fn output(&self) -> &[f32] {
        self.acts.last().map_or(&[], |a| a)
    }

    /// The gradient of the loss with respect to the output, `[rows, output]`, to fill before
    /// [`FlatMlp::backward`].
    pub fn output_grad(&mut self) -> &mut [f32] {
        let len = self.acts.last().map_or(0, Vec::len);
        self.grad.resize(len, 0.0);
        &mut self.grad
    }

    /// After a backward pass with `input_grad`: the gradient with respect to the input,
    /// `[rows, input]`.
    pub fn input_grad(&self) -> &[f32] {
        &self.grad
    }
}

impl FlatMlp {
    /// An MLP of these widths (`[input, hidden…, output]`, at least two) with zero parameters.
    ///
    /// # Panics
    /// With fewer than two widths.
    pub fn zeros(widths: Vec<usize>, activation: Activation) -> Self {
        assert!(widths.len() >= 2, "an MLP has an input and an output width");
        let len = widths.windows(2).map(|w| (w[0] + 1) * w[1]).sum();
        Self {
            widths,
            activation,
            params: vec![0.0; len],
        }
    }

    /// The MLP whose layers are `{prefix}layers.{l}.weight` (`[in, out]`) and
    /// `{prefix}layers.{l}.bias` in `tensors` (as rein-model's `Mlp` names them), layer 0 up to
    /// the first missing. The error names a missing bias or a weight of the wrong shape.
    pub fn from_tensors(tensors: &Tensors, prefix: &str, activation: Activation) -> Result<Self, String> {
        let mut layers = Vec::new();
        while let Some((shape, weight)) = tensors.get(&format!("{prefix}layers.{}.weight", layers.len())) {
            let name = format!("{prefix}layers.{}", layers.len());
            let [rows, cols] = shape[..] else {
                return Err(format!("`{name}.weight` has shape {shape:?}, not [in, out]"));
            };
            let bias = match tensors.get(&format!("{name}.bias")) {
                Some((shape, bias)) if shape[..] == [cols] => bias,
                Some((shape, _)) => return Err(format!("`{name}.bias` has shape {shape:?}, not [{cols}]")),
                None => return Err(format!("`{name}.bias` is missing")),
            };
            layers.push(([rows, cols], weight, bias));
        }
        let Some(&([input, _], ..)) = layers.first() else {
            return Err(format!("no `{prefix}layers.0.weight`"));
        };
        let mut widths = vec![input];
        let mut params = Vec::new();
        for ([rows, cols], weight, bias) in layers {
            if rows != *widths.last().expect("one width") {
                return Err(format!(
                    "`{prefix}layers.{}.weight` takes {rows} inputs; the layer before gives {}",
                    widths.len() - 1,
                    widths.last().expect("one width")
                ));
            }
            widths.push(cols);
            params.extend_from_slice(weight);
            params.extend_from_slice(bias);
        }
        Ok(Self {
            widths,
            activation,
            params,
        })
    }

    /// The parameters as [`FlatMlp::from_tensors`] reads them.
    pub fn to_tensors(&self, prefix: &str) -> Tensors {
        let mut tensors = Tensors::new();
        for l in 0..self.depth() {
            let (weight, bias) = self.layer(l);
            let [input, output] = [self.widths[l], self.widths[l + 1]];
            let name = format!("{prefix}layers.{l}");
            tensors.insert(format!("{name}.weight"), (vec![input, output], weight.to_vec()));
            tensors.insert(format!("{name}.bias"), (vec![output], bias.to_vec()));
        }
        tensors
    }

    /// `[input, hidden…, output]`.
    pub fn widths(&self) -> &[usize] {
        &self.widths
    }

    /// Linear layers.
    pub fn depth(&self) -> usize {
        self.widths.len() - 1
    }

    /// Every parameter, layer after layer (weight, then bias).
    pub fn params(&self) -> &[f32] {
        &self.params
    }

    /// See [`FlatMlp::params`].
    pub fn params_mut(&mut self) -> &mut [f32] {
        &mut self.params
    }

    /// The name (`layers.{l}.weight` or `.bias`) of parameter `index`.
    pub fn param_name(&self, index: usize) -> String {
        let mut start = 0;
        for l in 0..self.depth() {
            let [input, output] = [self.widths[l], self.widths[l + 1]];
            if index < start + input * output {
                return format!("layers.{l}.weight");
            }
            if index < start + (input + 1) * output {
                return format!("layers.{l}.bias");
            }
            start += (input + 1) * output;
        }
        format!("parameter {index} of {}", self.params.len())
    }

    /// Where layer `l`'s weight starts in the buffer.
    fn offset(&self, l: usize) -> usize {
        self.widths[..=l].windows(2).map(|w| (w[0] + 1) * w[1]).sum()
    }

    /// Layer `l`'s weight `[in, out]` and bias.
    fn layer(&self, l: usize) -> (&[f32], &[f32]) {
        let [input, output] = [self.widths[l], self.widths[l + 1]];
        let at = self.offset(l);
        self.params[at..at + (input + 1) * output].split_at(input * output)
    }

    /// The forward pass on the input [`Trace::input`] holds; the output is
    /// [`Trace::output`].
    pub fn forward(&self, trace: &mut Trace) {
        let rows = trace.rows;
        for l in 0..self.depth() {
            let (weight, bias) = self.layer(l);
            let [input, output] = [self.widths[l], self.widths[l + 1]];
            let (before, after) = trace.acts.split_at_mut(l + 1);
            let (x, y) = (&before[l], &mut after[0]);
            matmul_bias(y, output, matrix(x, rows, input), matrix(weight, input, output), bias);
            if l + 1 < self.depth() {
                match self.activation {
                    Activation::Relu => wide(|| y.iter_mut().for_each(|v| *v = v.max(0.0))),
                    Activation::Tanh => wide(|| y.iter_mut().for_each(|v| *v = crate::backend::tanh_f32(*v))),
                }
            }
        }
    }

    /// The backward pass of the last forward pass from the gradient [`Trace::output_grad`]
    /// holds: the parameters' gradient into `grads` (overwritten; `None` skips it) and, with
    /// `input_grad`, the input's into [`Trace::input_grad`].
    ///
    /// # Panics
    /// If `grads` is not one value per parameter.
    pub fn backward(&self, trace: &mut Trace, mut grads: Option<&mut [f32]>, input_grad: bool) {
        if let Some(grads) = &grads {
            assert_eq!(grads.len(), self.params.len(), "one gradient per parameter");
        }
        let rows = trace.rows;
        for l in (0..self.depth()).rev() {
            let [input, output] = [self.widths[l], self.widths[l + 1]];
            let (x, g) = (&trace.acts[l], &trace.grad);
            if let Some(grads) = grads.as_deref_mut() {
                let at = self.offset(l);
                let (d_weight, d_bias) = grads[at..at + (input + 1) * output].split_at_mut(input * output);
                let x = matrix(x, rows, input).t();
                matmul(d_weight, output, x, matrix(g, rows, output), Init::Zero);
                d_bias.fill(0.0);
                for row in g.chunks_exact(output) {
                    d_bias.iter_mut().zip(row).for_each(|(d, g)| *d += g);
                }
            }
            if l == 0 && !input_grad {
                break;
            }
            let (weight, _) = self.layer(l);
            let d_x = &mut trace.scratch;
            d_x.resize(rows * input, 0.0);
            let weight_t = MatRef::new(weight, 0, [output, input], [1, output]).expect("the layer's weight");
            matmul(d_x, input, matrix(g, rows, output), weight_t, Init::Zero);
            if l > 0 {
                // `x` is the previous layer's output, after its activation.
                match self.activation {
                    // A select, not a branch, so that the loop is vectorised.
                    Activation::Relu => wide(|| {
                        let pairs = d_x.iter_mut().zip(x);
                        pairs.for_each(|(d, y)| *d = if *y > 0.0 { *d } else { 0.0 })
                    }),
                    Activation::Tanh => wide(|| d_x.iter_mut().zip(x).for_each(|(d, y)| *d *= 1.0 - y * y)),
                }
            }
            std::mem::swap(&mut trace.grad, &mut trace.scratch);
        }
    }
}

/// Runs the element-wise loop `f` compiled for the vector width the kernels use on this CPU
/// ([`Isa::active`]). Its operations (IEEE `+ − × ÷`, `min`, `max`, selects, never fused) give
/// the same bits at any width, so this changes the speed only.
fn wide(f: impl FnOnce()) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f")]
        fn avx512(f: impl FnOnce()) {
            f()
        }
        #[target_feature(enable = "avx2")]
        fn avx2(f: impl FnOnce()) {
            f()
        }
        match Isa::active() {
            // SAFETY: the active level is one this CPU has.
            Isa::Avx512 => return unsafe { avx512(f) },
            // SAFETY: as above.
            Isa::Avx2 => return unsafe { avx2(f) },
            Isa::Scalar => {}
        }
    }
    f()
}

/// A row-major `rows × cols` view of `data`.
fn matrix(data: &[f32], rows: usize, cols: usize) -> MatRef<'_> {
    MatRef::row_major(data, rows, cols).expect("a buffer sized for the batch")
}

#[cfg(test)]
mod tests {
    use burn::module::AutodiffModule;
    use burn::tensor::{Tensor, TensorData};
    use proptest::prelude::*;
    use rein_core::SeededRng;

    use super::*;
    use crate::safetensors_file::module_tensors;
    use crate::{CpuAutodiff, MlpConfig, MlpInit};

    /// An `Mlp` and its flat copy; `loss = Σ out ⊙ c` for fixed `c`, so `∂out = c`.
    fn case(widths: &[usize], activation: Activation, rows: usize, seed: u64) {
        let device = Default::default();
        let mut rng = SeededRng::new(seed);
        let mlp = MlpConfig {
            input: widths[0],
            hidden: widths[1..widths.len() - 1].to_vec(),
            output: widths[widths.len() - 1],
            activation,
            init: MlpInit::FanInUniform,
        }
        .init::<CpuAutodiff>(&mut rng, &device);
        let flat = FlatMlp::from_tensors(&module_tensors(&mlp.valid()), "", activation).unwrap();
        let (input, output) = (widths[0], widths[widths.len() - 1]);
        let x: Vec<f32> = (0..rows * input).map(|_| 2.0 * rng.normal() as f32).collect();
        let c: Vec<f32> = (0..rows * output).map(|_| rng.normal() as f32).collect();
        let x_tensor =
            Tensor::<CpuAutodiff, 2>::from_data(TensorData::new(x.clone(), [rows, input]), &device).require_grad();
        let c_tensor = Tensor::<CpuAutodiff, 2>::from_data(TensorData::new(c.clone(), [rows, output]), &device);
        let out = mlp.forward(x_tensor.clone());
        let burn_out: Vec<f32> = out.clone().into_data().to_vec().unwrap();
        let grads = (out * c_tensor).sum().backward();
        let burn_input_grad: Vec<f32> = x_tensor.grad(&grads).unwrap().into_data().to_vec().unwrap();
        let burn_grads = grads_by_name(&mlp, &grads);

        let mut trace = Trace::default();
        trace.input(&flat, rows).copy_from_slice(&x);
        flat.forward(&mut trace);
        assert_eq!(bits(trace.output()), bits(&burn_out), "outputs");
        trace.output_grad().copy_from_slice(&c);
        let mut param_grads = vec![f32::NAN; flat.params().len()];
        flat.backward(&mut trace, Some(&mut param_grads), true);
        assert_eq!(bits(trace.input_grad()), bits(&burn_input_grad), "input gradient");
        let expected = FlatMlp::from_tensors(&burn_grads, "", activation).unwrap();
        assert_eq!(bits(&param_grads), bits(expected.params()), "parameter gradients");
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Each parameter's gradient under the parameter's path (as `module_tensors` names them).
    fn grads_by_name(
        mlp: &crate::Mlp<CpuAutodiff>,
        grads: &<CpuAutodiff as burn::tensor::backend::AutodiffBackend>::Gradients,
    ) -> Tensors {
        struct Collect<'a> {
            path: Vec<String>,
            grads: &'a <CpuAutodiff as burn::tensor::backend::AutodiffBackend>::Gradients,
            tensors: Tensors,
        }
        impl burn::module::ModuleVisitor<CpuAutodiff> for Collect<'_> {
            fn enter_module(&mut self, name: &str, _: &str) {
                self.path.push(name.to_string());
            }
            fn exit_module(&mut self, _: &str, _: &str) {
                self.path.pop();
            }
            fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<CpuAutodiff, D>>) {
                let grad = param.val().grad(self.grads).expect("every parameter has a gradient");
                let shape = grad.dims().to_vec();
                self.tensors
                    .insert(self.path.join("."), (shape, grad.into_data().to_vec().unwrap()));
            }
        }
        let mut collect = Collect {
            path: Vec::new(),
            grads,
            tensors: Tensors::new(),
        };
        burn::module::Module::visit(mlp, &mut collect);
        collect.tensors
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Values and gradients (parameters and input) equal burn's autodiff on the module,
        /// bit for bit, for ReLU and tanh MLPs of one to three hidden layers.
        #[test]
        fn equals_burns_autodiff(
            widths in proptest::collection::vec(1usize..40, 3..6),
            relu in any::<bool>(),
            rows in 1usize..70,
            seed in 0u64..1000,
        ) {
            let activation = if relu { Activation::Relu } else { Activation::Tanh };
            case(&widths, activation, rows, seed);
        }
    }

    #[test]
    fn the_tensors_read_back_and_bad_shapes_are_named() {
        let mut flat = FlatMlp::zeros(vec![3, 4, 2], Activation::Relu);
        flat.params_mut()
            .iter_mut()
            .enumerate()
            .for_each(|(i, p)| *p = i as f32);
        let tensors = flat.to_tensors("mlp.");
        assert_eq!(FlatMlp::from_tensors(&tensors, "mlp.", Activation::Relu).unwrap(), flat);
        assert_eq!(flat.param_name(11), "layers.0.weight");
        assert_eq!(flat.param_name(12), "layers.0.bias");
        assert_eq!(flat.param_name(16), "layers.1.weight");
        let mut broken = tensors.clone();
        broken.remove("mlp.layers.1.bias");
        assert_eq!(
            FlatMlp::from_tensors(&broken, "mlp.", Activation::Relu).unwrap_err(),
            "`mlp.layers.1.bias` is missing"
        );
        let mut broken = tensors;
        broken.insert("mlp.layers.1.weight".into(), (vec![5, 2], vec![0.0; 10]));
        assert_eq!(
            FlatMlp::from_tensors(&broken, "mlp.", Activation::Relu).unwrap_err(),
            "`mlp.layers.1.weight` takes 5 inputs; the layer before gives 4"
        );
    }
}

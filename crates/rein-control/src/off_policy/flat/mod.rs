//! SAC and TD3 on [`FlatMlp`]s: the same updates as [`super::sac`] and [`super::td3`], in the
//! same order and from the same initial weights, computed by hand on flat buffers (forward and
//! backward passes without autodiff, [`FlatAdam`], Polyak averaging in place) so that an update
//! of two 64-unit critics and an actor costs its products and little else. The two critics run
//! side by side on two threads (`rein_kernels::team::join`; each critic's numbers do not depend on
//! the other's thread).
//!
//! The losses' gradients are written out next to their equations: the squashed Gaussian's in
//! rein-optim ([`rein_optim::squashed_gaussian_row_backward`]), the rest below.
//!
//! `model.autodiff = true` in a recipe keeps the burn modules instead.

pub mod sac;
pub mod td3;

use burn::module::AutodiffModule;
use rein_core::{Activation, BoxSpace};
use rein_model::safetensors_file::module_tensors;
use rein_model::{FlatMlp, QNetwork, ReinAutodiffBackend, Trace};
use rein_optim::FlatAdam;

use crate::flat_sections::{floats_bytes, non_finite, read_adam, read_params};
use crate::off_policy::sac::TwinCritics;
use rein_run::checkpoint::{Checkpoint, CheckpointError};
use rein_run::driver::Section;

/// One critic `Q(s, a)`, its target `Q̄`, its optimiser and the buffers its passes reuse.
#[derive(Debug, Clone)]
struct Critic {
    net: FlatMlp,
    target: FlatMlp,
    adam: FlatAdam,
    trace: Trace,
    target_trace: Trace,
    grads: Vec<f32>,
}

impl Critic {
    /// The critic of `net` (a burn module), its target `target` or a copy.
    fn new<B: ReinAutodiffBackend>(net: &QNetwork<B>, target: Option<&QNetwork<B::InnerBackend>>) -> Self {
        let net = flat(&module_tensors(&net.valid()));
        Self {
            target: target.map_or_else(|| net.clone(), |t| flat(&module_tensors(t))),
            adam: FlatAdam::new(net.params().len()),
            grads: vec![0.0; net.params().len()],
            trace: Trace::default(),
            target_trace: Trace::default(),
            net,
        }
    }

    /// `Q(s, a)` for each row, kept for [`Critic::step_toward`] or [`Critic::action_grad`].
    fn values(&mut self, obs: &[f32], actions: &[f32], rows: usize) -> &[f32] {
        fill_input(self.trace.input(&self.net, rows), obs, actions, rows);
        self.net.forward(&mut self.trace);
        self.trace.output()
    }

    /// `Q̄(s', a')` for each row.
    fn target_values(&mut self, obs: &[f32], actions: &[f32], rows: usize) -> &[f32] {
        fill_input(self.target_trace.input(&self.target, rows), obs, actions, rows);
        self.target.forward(&mut self.target_trace);
        self.target_trace.output()
    }

    /// One optimiser step on `mean((Q − y)²)` for the rows [`Critic::values`] last saw:
    /// `(loss, mean Q)`.
    fn step_toward(&mut self, y: &[f32], lr: f64) -> (f32, f32) {
        let rows = y.len() as f32;
        let q = self.trace.output();
        let loss = q.iter().zip(y).map(|(q, y)| (q - y) * (q - y)).sum::<f32>() / rows;
        let mean = q.iter().sum::<f32>() / rows;
        // ∂/∂Qᵢ mean((Q − y)²) = 2 (Qᵢ − yᵢ) / n.
        let d_q: Vec<f32> = q.iter().zip(y).map(|(q, y)| (q - y) * 2.0 / rows).collect();
        self.trace.output_grad().copy_from_slice(&d_q);
        self.net.backward(&mut self.trace, Some(&mut self.grads), false);
        self.adam.step(lr, self.net.params_mut(), &self.grads);
        (loss, mean)
    }

    /// `∂L/∂a` for the rows [`Critic::values`] last saw, given `∂L/∂Q` (`[rows]`), added into
    /// `d_actions` (`[rows, act_dim]`); the critic's parameters are not touched.
    fn add_action_grad(&mut self, d_q: &[f32], d_actions: &mut [f32]) {
        self.trace.output_grad().copy_from_slice(d_q);
        self.net.backward(&mut self.trace, None, true);
        let (width, act_dim) = (self.net.widths()[0], d_actions.len() / d_q.len().max(1));
        for (row, d) in self
            .trace
            .input_grad()
            .chunks_exact(width)
            .zip(d_actions.chunks_exact_mut(act_dim))
        {
            d.iter_mut().zip(&row[width - act_dim..]).for_each(|(d, g)| *d += g);
        }
    }
}

/// The twin critics, each on its own thread.
#[derive(Debug, Clone)]
struct Twin([Critic; 2]);

impl Twin {
    /// The critics of `critics`, their targets `targets` or copies.
    fn new<B: ReinAutodiffBackend>(critics: &TwinCritics<B>, targets: Option<&TwinCritics<B::InnerBackend>>) -> Self {
        Self([
            Critic::new(&critics.q1, targets.map(|t| &t.q1)),
            Critic::new(&critics.q2, targets.map(|t| &t.q2)),
        ])
    }

    /// `f(k, Qₖ)` on both critics at once.
    fn both<R: Send>(&mut self, f: impl Fn(usize, &mut Critic) -> R + Sync) -> [R; 2] {
        let [q1, q2] = &mut self.0;
        let (r1, r2) = rein_kernels::team::join(|| f(0, q1), || f(1, q2));
        [r1, r2]
    }

    /// `min(Q̄₁, Q̄₂)(s', a')` for each row.
    fn target_min(&mut self, obs: &[f32], actions: &[f32], rows: usize) -> Vec<f32> {
        self.both(|_, c| {
            c.target_values(obs, actions, rows);
        });
        let [q1, q2] = &self.0;
        let pairs = q1.target_trace.output().iter().zip(q2.target_trace.output());
        pairs.map(|(a, b)| a.min(*b)).collect()
    }

    /// Both critics' step toward `y`: `[(loss, mean Q)]`.
    fn step_toward(&mut self, obs: &[f32], actions: &[f32], y: &[f32], lr: f64) -> [(f32, f32); 2] {
        self.both(|_, c| {
            c.values(obs, actions, y.len());
            c.step_toward(y, lr)
        })
    }

    /// `θ̄ ← τ θ + (1 − τ) θ̄` for both critics.
    fn polyak(&mut self, tau: f64) {
        for c in &mut self.0 {
            polyak(&mut c.target, &c.net, tau);
        }
    }

    /// The critics, targets and optimisers as sections.
    fn sections(&self) -> Vec<Section> {
        let mut sections = Vec::new();
        for (c, name) in self.0.iter().zip(["q1", "q2"]) {
            sections.push((name.into(), floats_bytes(c.net.params())));
            sections.push((format!("{name}_optimizer"), c.adam.to_bytes()));
            sections.push((format!("target_{name}"), floats_bytes(c.target.params())));
        }
        sections
    }

    /// What [`Twin::sections`] wrote.
    fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        for (c, name) in self.0.iter_mut().zip(["q1", "q2"]) {
            read_params(checkpoint, name, &mut c.net)?;
            read_adam(checkpoint, &format!("{name}_optimizer"), &mut c.adam)?;
            read_params(checkpoint, &format!("target_{name}"), &mut c.target)?;
        }
        Ok(())
    }

    /// The first critic parameter holding a NaN or an infinity, named.
    fn non_finite_parameter(&self) -> Option<String> {
        let nets = self.0.iter().zip(["q1", "q2"]);
        nets.filter_map(|(c, name)| non_finite(&c.net, &format!("critics.{name}.mlp.")))
            .next()
    }
}

/// The network a burn module's `mlp.layers.*` tensors describe (ReLU between layers, as
/// rein-model's off-policy networks have).
fn flat(tensors: &rein_model::safetensors_file::Tensors) -> FlatMlp {
    FlatMlp::from_tensors(tensors, "mlp.", Activation::Relu).expect("an off-policy network is an MLP")
}

/// `[s, a]` side by side, row by row, into `input`.
fn fill_input(input: &mut [f32], obs: &[f32], actions: &[f32], rows: usize) {
    let (obs_dim, act_dim) = (obs.len() / rows.max(1), actions.len() / rows.max(1));
    let width = obs_dim + act_dim;
    // Column by column: a `copy_from_slice` per row of three values was a `memcpy` call each,
    // ~5% of an SAC update.
    for (offset, values, dim) in [(0, obs, obs_dim), (obs_dim, actions, act_dim)] {
        for j in 0..dim {
            let to = input[offset + j..].iter_mut().step_by(width);
            to.zip(values[j..].iter().step_by(dim)).for_each(|(to, v)| *to = *v);
        }
    }
}

/// `θ̄ ← τ θ + (1 − τ) θ̄`, in the operations rein-optim's `polyak_update` takes.
fn polyak(target: &mut FlatMlp, online: &FlatMlp, tau: f64) {
    let (tau, keep) = (tau as f32, (1.0 - tau) as f32);
    for (t, o) in target.params_mut().iter_mut().zip(online.params()) {
        *t = o * tau + *t * keep;
    }
}

/// The action box as the per-dimension values an update reads.
#[derive(Debug, Clone)]
struct FlatBox {
    /// `s_a = (high − low)/2`.
    scale: Vec<f32>,
    /// `b_a = (high + low)/2`.
    bias: Vec<f32>,
    low: Vec<f32>,
    high: Vec<f32>,
}

impl FlatBox {
    fn new(bounds: &BoxSpace) -> Self {
        let sides = || bounds.low.iter().zip(&bounds.high);
        Self {
            scale: sides().map(|(l, h)| (h - l) / 2.0).collect(),
            bias: sides().map(|(l, h)| (h + l) / 2.0).collect(),
            low: bounds.low.clone(),
            high: bounds.high.clone(),
        }
    }
}

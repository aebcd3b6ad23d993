//! Resuming a run on environments: the environments' state lives in their plugins, which the
//! host cannot read, so a checkpoint holds every action sent to them, and resuming resets them with the
//! run's seed and sends those actions again (plugins are deterministic: their clocks are
//! virtual, their randomness fixed), then checks that the observations reached equal the
//! saved ones.

use rein_core::{BatchActions, FailureCounts, Space, VecEnv};

use crate::ControlError;
use rein_run::checkpoint::Checkpoint;

/// Sends freshly reset environments `actions` (the log of a checkpoint) again, returning the
/// observations reached; errors if they differ from the `saved` ones, since then the plugin is
/// not deterministic and the run cannot continue exactly.
fn replay(
    envs: &mut dyn VecEnv,
    reset_obs: Vec<f32>,
    actions: &[f32],
    saved: &[f32],
    plugin: &str,
    checkpoint: &Checkpoint,
) -> Result<Vec<f32>, ControlError> {
    let width = action_width(envs);
    let discrete = matches!(envs.spec().action, Space::Discrete(_));
    let mut obs = reset_obs;
    for step in actions.chunks(envs.num_envs() * width) {
        let batch = if discrete {
            BatchActions::Discrete(step.iter().map(|&a| a as u32).collect())
        } else {
            BatchActions::Continuous(step.to_vec())
        };
        obs = envs.step(&batch)?.observations;
    }
    if obs.iter().map(|x| x.to_bits()).ne(saved.iter().map(|x| x.to_bits())) {
        return Err(rein_run::RunError::Resume {
            run: checkpoint.path.clone(),
            message: format!(
                "replaying the recorded actions in environment plugin `{plugin}` reached other observations than the run did: the plugin is not deterministic"
            ),
        }
            .into());
    }
    Ok(obs)
}

/// A run's environments, the observations they are at, and — when checkpoints are written —
/// every action sent to them, which is how a checkpoint restores them.
pub(crate) struct RecordedEnvs {
    /// The environment plugin, as the recipe names it.
    pub(crate) plugin: String,
    pub(crate) envs: Box<dyn VecEnv>,
    /// The observations the environments are at (each step's, after same-step resets).
    pub(crate) next_obs: Vec<f32>,
    action_log: Option<Vec<f32>>,
}

impl RecordedEnvs {
    /// `envs` reset with `seed`; with `log_actions`, every action sent will be kept.
    pub(crate) fn new(
        plugin: String,
        mut envs: Box<dyn VecEnv>,
        seed: u64,
        log_actions: bool,
    ) -> Result<Self, ControlError> {
        Ok(Self {
            plugin,
            next_obs: envs.reset(seed)?,
            envs,
            action_log: log_actions.then(Vec::new),
        })
    }

    /// Keeps `actions`, about to be sent, when actions are logged.
    pub(crate) fn log(&mut self, actions: &BatchActions) {
        match (&mut self.action_log, actions) {
            (None, _) => {}
            (Some(log), BatchActions::Discrete(a)) => log.extend(a.iter().map(|&a| a as f32)),
            (Some(log), BatchActions::Continuous(a)) => log.extend_from_slice(a),
        }
    }

    /// The checkpoint sections of the environments' state: every action sent (`actions`, empty
    /// when none were logged) and the observations they reached (`next_obs`).
    pub(crate) fn sections(&self) -> [(String, Vec<u8>); 2] {
        [
            (
                "actions".into(),
                bytes_of(self.action_log.as_deref().unwrap_or_default()),
            ),
            ("next_obs".into(), bytes_of(&self.next_obs)),
        ]
    }

    /// Brings the freshly reset environments to `checkpoint`'s state by replaying its actions
    /// ([`replay`]); the action log, when kept, continues from the checkpoint's.
    pub(crate) fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), ControlError> {
        let actions = f32s(checkpoint.section("actions")?);
        let saved = f32s(checkpoint.section("next_obs")?);
        let reset = std::mem::take(&mut self.next_obs);
        self.next_obs = replay(self.envs.as_mut(), reset, &actions, &saved, &self.plugin, checkpoint)?;
        let env_steps = actions.len() / action_width(self.envs.as_ref()).max(1);
        eprintln!("replayed {env_steps} env steps into `{}`", self.plugin);
        self.action_log = self.action_log.take().map(|_| actions);
        Ok(())
    }

    /// The plugin's failed calls so far, for the driver.
    pub(crate) fn failures(&self) -> Vec<(String, FailureCounts)> {
        vec![(self.plugin.clone(), self.envs.failures())]
    }
}

/// Values per environment per action.
fn action_width(envs: &dyn VecEnv) -> usize {
    match &envs.spec().action {
        Space::Box(b) => b.dim(),
        _ => 1,
    }
}

/// The bytes of `values` (native byte order, as checkpoints are read where they are written).
fn bytes_of(values: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(values).to_vec()
}

/// The values of [`bytes_of`].
fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytemuck::pod_collect_to_vec(bytes)
}

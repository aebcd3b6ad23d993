//! Running a language-model recipe: the SFT stage, the recipe's own algorithm (the GRPO family,
//! DPO, KTO, reward models), evaluations before and after, checkpoints and a report, on what
//! [`crate::run::setup`] built.

pub(crate) mod recipe_keys;
pub(crate) mod report;
pub(crate) mod setup;

use std::path::Path;
use std::time::{Duration, Instant};

use burn::module::AutodiffModule;
use rein_core::SamplerBackend;
use rein_model::lm::{CausalLm, LmTokenizer, SequenceClassifier, TokenClassifier, load, save};
use rein_model::{ReinAutodiffBackend, ReinBackend};
use rein_optim::DpoConfig;
use rein_sampler::{Generator, HttpGenerator, HttpSettings, NativeGenerator, SeededRng};
use serde_json::json;

use crate::LmError;
use crate::run::recipe_keys::{invalid, model_path};
pub use crate::run::report::{DpoOutcome, KtoOutcome, LmOutcome, ProcessRewardModelOutcome, RewardModelOutcome};
use crate::run::report::{log_eval, report_markdown};
use crate::run::setup::{LmSetup, lora_spec, setup};
use crate::{EvalReport, ImplicitPrm, OnlineOutcome, PpoCritic, Update};
use rein_recipe::{
    DpoRecipe, DpoSection, GrpoRecipe, KtoRecipe, KtoSection, LmPpoRecipe, LoadedRecipe, OnlineDpoRecipe, Plan,
    ProcessRewardModelRecipe, ProcessRewardModelSection, RewardModelRecipe, RewardModelSection, Rollout,
};
use rein_run::checkpoint::{Checkpoint, Checkpointing};
use rein_run::driver::{self, Driven, Driver, Trainer};
use rein_run::{MetricsWriter, RunDir};

/// Where GRPO's completions come from: the native sampler, or the inference servers of
/// `sampler.urls` (waited for until they answer), with the policy written under
/// `sampler.weights_dir` (default `<run>/weights`).
fn generator<B: ReinBackend>(
    loaded: &LoadedRecipe,
    tokenizer: &LmTokenizer,
    run: Option<&RunDir>,
    device: &B::Device,
) -> Result<Box<dyn Generator<B>>, LmError>
where
    CausalLm<B>: Send,
{
    let sampler = &loaded.recipe.sampler;
    if sampler.backend == SamplerBackend::Native {
        return Ok(Box::new(NativeGenerator::<B>::new(tokenizer.clone(), device)));
    }
    let weights_dir = match (&sampler.weights_dir, run) {
        (Some(dir), _) => loaded.resolve(dir),
        (None, Some(run)) => run.path().join("weights"),
        (None, None) => std::env::temp_dir().join(format!("rein-weights-{}", std::process::id())),
    };
    let settings = HttpSettings {
        urls: sampler
            .urls
            .iter()
            .map(|u| u.trim_end_matches('/').to_string())
            .collect(),
        api: sampler.api,
        model: sampler.server_model.clone(),
        timeout: Duration::from_secs_f64(sampler.request_timeout_s),
        retries: sampler.retries,
        backoff: Duration::from_secs_f64(sampler.backoff_s),
        weights_dir,
        adapter_only: sampler.sync == rein_core::PolicySync::Adapter,
        keep_versions: 2,
    };
    let http = HttpGenerator::<B>::new(settings);
    http.wait_ready(Duration::from_secs_f64(sampler.request_timeout_s.min(120.0)))
        .map_err(|error| LmError::generator(0, error))?;
    eprintln!("sampling on {}", http.describe());
    Ok(Box::new(http))
}

/// Which stage of a language-model run a checkpoint was taken in, and what the stages before
/// it produced (the `stage` section of every checkpoint of such a run).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(tag = "stage", rename_all = "lowercase")]
enum LmStage {
    /// SFT (before RL, or the whole algorithm).
    Sft,
    /// The algorithm's own stage (GRPO, DPO), after SFT (if any) and the evaluation before it.
    #[serde(alias = "grpo")]
    AfterSft {
        /// The held-out evaluation before RL.
        before: Option<EvalReport>,
        /// Seconds the SFT stage took.
        sft_seconds: f64,
    },
}

impl LmStage {
    fn section(&self) -> (String, Vec<u8>) {
        ("stage".into(), serde_json::to_vec(self).expect("the stage serialises"))
    }
}

/// Runs an SFT or GRPO recipe on backend `B`, checkpointing (and resuming) as `checkpointing`
/// says: a checkpoint taken during GRPO continues there, with the model GRPO started from read
/// back from `<run>/sft` for the KL reference.
pub fn run_lm<B: ReinAutodiffBackend>(
    loaded: &LoadedRecipe,
    plan: Plan<'_>,
    plugin_dir: &Path,
    run: Option<&RunDir>,
    checkpointing: &Checkpointing,
    device: &B::Device,
) -> Result<LmOutcome, LmError> {
    let start = Instant::now();
    let data_dir = crate::data_dir(run.map(RunDir::path));
    let setup = setup::<B>(loaded, plan, plugin_dir, data_dir.as_deref(), None, device)?;
    let resumed = match &checkpointing.resume {
        Some(c) => Some((c, c.section_json::<LmStage>("stage")?)),
        None => None,
    };
    let metrics_len = resumed.as_ref().map_or(Ok(0), |(c, _)| driver::metrics_len(c))?;
    let mut stages = Stages {
        loaded,
        plan,
        run,
        checkpointing,
        resumed,
        metrics: (run.map(|r| r.metrics_from(metrics_len, loaded.recipe.train.tensorboard()))).transpose()?,
        stall_timeout: Duration::from_secs_f64(loaded.recipe.train.stall_timeout_s),
        setup,
        device: device.clone(),
    };
    let mut outcome = LmOutcome {
        run_dir: run.map(|r| r.path().to_path_buf()),
        ..LmOutcome::default()
    };
    let (mut model, stage) = stages.sft()?;
    if let LmStage::AfterSft { before, sft_seconds } = &stage {
        (outcome.before, outcome.sft_seconds) = (before.clone(), *sft_seconds);
    }
    if let Some(report) = &outcome.before {
        eprintln!("held-out before RL: {}", report.one_line());
    }
    model = stages.algorithm(model, stage, &mut outcome)?;
    let causal = !matches!(plan, Plan::RewardModel(_) | Plan::Prm(_));
    if let Some(run) = run.filter(|_| causal) {
        save_model_dir(&model, &stages.setup, &run.path().join("final"))?;
        if model.lora.is_some() {
            let base = loaded.recipe.model.path.as_deref().unwrap_or_default();
            rein_model::lm::peft::save_adapter(&model, &run.path().join("adapter"), base)?;
        }
    }
    outcome.total_seconds = start.elapsed().as_secs_f64();
    if let Some(run) = run {
        let report = report_markdown(loaded, &outcome);
        std::fs::write(run.path().join("report.md"), &report)?;
        if let Some(metrics) = stages.metrics.as_mut() {
            metrics.text("report", &report)?;
        }
    }
    Ok(outcome)
}

/// What the stages of a language-model run share.
struct Stages<'a, B: ReinAutodiffBackend> {
    loaded: &'a LoadedRecipe,
    /// The recipe's algorithm with its sections, matched once by the launcher.
    plan: Plan<'a>,
    run: Option<&'a RunDir>,
    checkpointing: &'a Checkpointing,
    /// The checkpoint resumed from and the stage it was taken in.
    resumed: Option<(&'a Checkpoint, LmStage)>,
    metrics: Option<MetricsWriter>,
    stall_timeout: Duration,
    setup: LmSetup<B>,
    device: B::Device,
}

impl<B: ReinAutodiffBackend> Stages<'_, B> {
    /// The recipe's own algorithm after the SFT stage (none for SFT alone), from `model`; fills
    /// `outcome` with what it measured and returns the model it leaves.
    fn algorithm(
        &mut self,
        mut model: CausalLm<B>,
        stage: LmStage,
        outcome: &mut LmOutcome,
    ) -> Result<CausalLm<B>, LmError> {
        let run = self.run;
        match self.plan {
            Plan::Grpo(plan @ GrpoRecipe { grpo: section, .. }) => {
                let online;
                (model, online, outcome.after) = self.online(model, plan.rollout(), Update::Grpo(section), stage)?;
                outcome.grpo = Some(online);
            }
            Plan::LmPpo(plan @ LmPpoRecipe { ppo, .. }) => {
                // The online stage's sampling and scoring, with PPO's critic, token advantages
                // and minibatches.
                let critic = crate::online::critic::critic_for(self.loaded, ppo, &model, &self.device)?;
                let update = Update::Ppo(Box::new(PpoCritic::new(critic, ppo, &self.loaded.recipe.optimizer)));
                let online;
                (model, online, outcome.after) = self.online(model, plan.rollout(), update, stage)?;
                outcome.grpo = Some(online);
            }
            Plan::OnlineDpo(
                plan @ OnlineDpoRecipe {
                    online_dpo: section, ..
                },
            ) => {
                // The online stage's sampling and scoring, with a DPO update on each group's best
                // and worst.
                let config = DpoConfig {
                    kind: section.loss_type,
                    beta: section.beta,
                    label_smoothing: section.label_smoothing,
                    sft_weight: section.sft_weight,
                };
                let online;
                (model, online, outcome.after) =
                    self.online(model, plan.rollout(), Update::OnlineDpo(config), stage)?;
                outcome.grpo = Some(online);
            }
            Plan::Dpo(DpoRecipe { dpo: section, .. }) => {
                let dpo;
                (model, dpo, outcome.after) = self.dpo(model, section, stage)?;
                outcome.dpo = Some(dpo);
            }
            Plan::Kto(KtoRecipe { kto: section, .. }) => {
                let kto;
                (model, kto, outcome.after) = self.kto(model, section, stage)?;
                outcome.kto = Some(kto);
            }
            Plan::RewardModel(RewardModelRecipe {
                reward_model: section, ..
            }) => {
                let (reward_model, trained) = self.reward_model(model.clone(), section, stage)?;
                if let Some(run) = run {
                    let dir = run.path().join("final");
                    reward_model.save(&dir)?;
                    self.setup.tokenizer.save(&dir)?;
                }
                outcome.reward_model = Some(trained);
            }
            Plan::Prm(ProcessRewardModelRecipe { prm: section, .. }) => {
                let (prm, trained) = self.process_reward_model(model.clone(), section, stage)?;
                if let Some(run) = run {
                    let dir = run.path().join("final");
                    prm.save(&dir)?;
                    self.setup.tokenizer.save(&dir)?;
                }
                outcome.process_reward_model = Some(trained);
            }
            Plan::Sft(_) | Plan::Ppo(_) | Plan::OffPolicy(_) => {}
        }
        Ok(model)
    }

    /// The SFT stage, when the recipe has one, and the evaluation before RL; or, resuming a
    /// checkpoint taken during GRPO, the model SFT produced (read back from `<run>/sft`).
    fn sft(&mut self) -> Result<(CausalLm<B>, LmStage), LmError> {
        let recipe = &self.loaded.recipe;
        let section = match self.plan {
            Plan::Sft(sft) => Some(sft.sft),
            _ => recipe.sft.as_ref(),
        };
        let mut model = self.setup.model.clone();
        if let Some((_, stage @ LmStage::AfterSft { .. })) = &self.resumed {
            let stage = stage.clone();
            if let (Some(_), Some(run)) = (section, self.run) {
                // Merged by SFT; the checkpoint's record has the base and the adapters apart.
                model = load(&run.path().join("sft"), &self.device)?.with_dtype(recipe.model_dtype());
                if let Some(spec) = lora_spec(self.loaded)? {
                    // The checkpoint's adapters replace these.
                    model = model.with_lora(&spec, &mut SeededRng::new(0), &self.device);
                }
            }
            return Ok((model, stage));
        }
        let mut sft_seconds = 0.0;
        if let Some(section) = section {
            eprintln!("SFT: {} steps of {} examples", section.steps, section.batch_size);
            let pad = self.setup.tokenizer.pad_id().unwrap_or(0);
            let devices = crate::data_parallel::devices(&self.device, recipe.train.devices);
            let mut sft = crate::Sft::new(model, &self.setup.train, pad, section, recipe.seed, devices)?;
            let checkpointing = self.checkpointing(self.resumed.as_ref().map(|(c, _)| (*c).clone()), 0, LmStage::Sft);
            let driven = Driver {
                metrics: self.metrics.as_mut(),
                checkpointing: &checkpointing,
                stall_timeout: self.stall_timeout,
                stage: Some("sft"),
            }
            .run(&mut sft)?;
            model = sft.model;
            sft_seconds = driven.elapsed.as_secs_f64();
            if let Some(run) = self.run {
                save_model_dir(&model, &self.setup, &run.path().join("sft"))?;
            }
        }
        let before = self.setup.evaluate(&model.valid(), self.loaded, &self.device)?;
        if let Some(report) = &before {
            log_eval(self.metrics.as_mut(), "before", 0, report)?;
        }
        Ok((model, LmStage::AfterSft { before, sft_seconds }))
    }

    /// The online stage from `model`: `rollout`'s sampling and scoring, the policy updated by
    /// `update`; then the evaluation after RL.
    fn online(
        &mut self,
        model: CausalLm<B>,
        rollout: Rollout,
        update: Update<'_, B>,
        stage: LmStage,
    ) -> Result<(CausalLm<B>, OnlineOutcome, Option<EvalReport>), LmError> {
        let recipe = &self.loaded.recipe;
        let name = update.name();
        let checkpointing = self.after_sft_checkpointing(stage);
        let ctx = crate::OnlineContext {
            tokenizer: &self.setup.tokenizer,
            prompts: &self.setup.train,
            rewards: &mut self.setup.rewards,
            signals: &self.setup.signals,
            accuracy_reward: self.setup.accuracy_index,
            curriculum: recipe.curriculum.as_ref(),
            rollout,
            sampler: &recipe.sampler,
            optimizer: &recipe.optimizer,
            seed: recipe.seed,
            agent: self.setup.agent.as_mut(),
        };
        let generator = generator::<B::InnerBackend>(self.loaded, &self.setup.tokenizer, self.run, &self.device)?;
        let devices = crate::data_parallel::devices(&self.device, recipe.train.devices);
        let mut online =
            crate::OnlineTrainer::with_generator(model, ctx, update, generator, &self.device)?.with_devices(devices)?;
        if let Some(teacher) = &recipe.teacher {
            let dir = model_path(self.loaded, &teacher.model);
            let model = load::<B::InnerBackend>(&dir, &self.device)
                .map_err(|e| invalid(self.loaded, "teacher.model", e.to_string()))?;
            online = online.with_teacher(model, teacher.coef as f32, teacher.kl)?;
        }
        if let Some(section) = &recipe.implicit_prm {
            let start = match &section.model {
                Some(path) => load::<B>(&model_path(self.loaded, path), &self.device)
                    .map_err(|e| invalid(self.loaded, "implicit_prm.model", e.to_string()))?,
                None => online.model().clone(),
            };
            online = online.with_implicit_prm(ImplicitPrm::new(start, section, &recipe.optimizer))?;
        }
        let driven = Driver {
            metrics: self.metrics.as_mut(),
            checkpointing: &checkpointing,
            stall_timeout: self.stall_timeout,
            stage: Some(name),
        }
        .run(&mut online)?;
        let outcome = online.outcome(driven.steps, &driven.phases);
        let model = online.into_model();
        let after = self.evaluate_after(&model, rollout.steps, "held-out after RL: ")?;
        Ok((model, outcome, after))
    }

    /// DPO from `model` (also its reference), then the evaluation after it.
    fn dpo(
        &mut self,
        model: CausalLm<B>,
        section: &DpoSection,
        stage: LmStage,
    ) -> Result<(CausalLm<B>, DpoOutcome, Option<EvalReport>), LmError> {
        let checkpointing = self.after_sft_checkpointing(stage);
        let pad = self.setup.tokenizer.pad_id().unwrap_or(0);
        eprintln!(
            "DPO ({:?}, β = {}): {} steps of {} pairs, from {} pairs ({} skipped)",
            section.loss_type,
            section.beta,
            section.steps,
            section.batch_size,
            self.setup.pairs.len(),
            self.setup.skipped_rows
        );
        let seed = self.loaded.recipe.seed;
        let mut dpo = crate::Dpo::new(model, &self.setup.pairs, pad, section, seed, &self.device)?;
        let driven = Driver {
            metrics: self.metrics.as_mut(),
            checkpointing: &checkpointing,
            stall_timeout: self.stall_timeout,
            stage: Some("dpo"),
        }
        .run(&mut dpo)?;
        let outcome = DpoOutcome {
            steps: driven.steps,
            seconds: driven.elapsed.as_secs_f64(),
            pairs: self.setup.pairs.len(),
            skipped: self.setup.skipped_rows,
        };
        let model = dpo.model;
        let after = self.evaluate_after(&model, section.steps, "held-out after DPO:")?;
        Ok((model, outcome, after))
    }

    /// KTO from `model` (also its reference), then the evaluation after it.
    fn kto(
        &mut self,
        model: CausalLm<B>,
        section: &KtoSection,
        stage: LmStage,
    ) -> Result<(CausalLm<B>, KtoOutcome, Option<EvalReport>), LmError> {
        let checkpointing = self.after_sft_checkpointing(stage);
        let pad = self.setup.tokenizer.pad_id().unwrap_or(0);
        let examples = &self.setup.labelled;
        let desirable = examples.iter().filter(|e| e.desirable).count();
        let undesirable = examples.len() - desirable;
        eprintln!(
            "KTO ({:?}, β = {}): {} steps of {} completions, from {desirable} desirable and {undesirable} \
             undesirable ({} rows skipped)",
            section.loss_type, section.beta, section.steps, section.batch_size, self.setup.skipped_rows
        );
        let seed = self.loaded.recipe.seed;
        let mut kto = crate::Kto::new(model, examples, pad, section, seed, &self.device)?;
        let driven = Driver {
            metrics: self.metrics.as_mut(),
            checkpointing: &checkpointing,
            stall_timeout: self.stall_timeout,
            stage: Some("kto"),
        }
        .run(&mut kto)?;
        let outcome = KtoOutcome {
            steps: driven.steps,
            seconds: driven.elapsed.as_secs_f64(),
            desirable,
            undesirable,
            skipped: self.setup.skipped_rows,
        };
        let model = kto.model;
        let after = self.evaluate_after(&model, section.steps, "held-out after KTO:")?;
        Ok((model, outcome, after))
    }

    /// Reward-model training on `decoder` with a fresh score head, with held-out pairwise
    /// accuracy before and after.
    fn reward_model(
        &mut self,
        decoder: CausalLm<B>,
        section: &RewardModelSection,
        stage: LmStage,
    ) -> Result<(SequenceClassifier<B>, RewardModelOutcome), LmError> {
        let recipe = &self.loaded.recipe;
        let checkpointing = self.after_sft_checkpointing(stage);
        let pad = self.setup.tokenizer.pad_id();
        let mut rng = SeededRng::new(recipe.seed ^ 0x5C0E);
        let model = SequenceClassifier::from_decoder(decoder, pad, section.init_std, &mut rng, &self.device);
        eprintln!(
            "reward model: {} steps of {} pairs, from {} pairs ({} held out, {} skipped)",
            section.steps,
            section.batch_size,
            self.setup.pairs.len(),
            self.setup.test_pairs.len(),
            self.setup.skipped_rows
        );
        let (pairs, test) = (&self.setup.pairs, &self.setup.test_pairs);
        let mut trainer = crate::BradleyTerry::new(model, pairs, test, section, recipe.seed, &self.device)?;
        let names = ("reward-model", "eval/pairwise_accuracy", "held-out pairwise accuracy");
        let run = (&mut self.metrics, self.stall_timeout);
        let (driven, before, after) = classifier_stage(
            run,
            &mut trainer,
            crate::BradleyTerry::test_accuracy,
            names,
            &checkpointing,
        )?;
        let outcome = RewardModelOutcome {
            steps: driven.steps,
            seconds: driven.elapsed.as_secs_f64(),
            pairs: pairs.len(),
            test_pairs: test.len(),
            skipped: self.setup.skipped_rows,
            accuracy_before: before,
            accuracy_after: after,
        };
        Ok((trainer.model, outcome))
    }

    /// Process-reward-model training on `decoder` with a fresh two-label head, with held-out
    /// step accuracy before and after.
    fn process_reward_model(
        &mut self,
        decoder: CausalLm<B>,
        section: &ProcessRewardModelSection,
        stage: LmStage,
    ) -> Result<(TokenClassifier<B>, ProcessRewardModelOutcome), LmError> {
        let recipe = &self.loaded.recipe;
        let checkpointing = self.after_sft_checkpointing(stage);
        let pad = self.setup.tokenizer.pad_id();
        let mut rng = SeededRng::new(recipe.seed ^ 0x9A3D);
        let model = TokenClassifier::from_decoder(decoder, 2, pad, section.init_std, &mut rng, &self.device);
        let (rows, test) = (&self.setup.stepwise.0, &self.setup.stepwise.1);
        eprintln!(
            "process reward model: {} steps of {} rows, from {} rows ({} held out, {} skipped)",
            section.steps,
            section.batch_size,
            rows.len(),
            test.len(),
            self.setup.skipped_rows
        );
        let mut trainer = crate::PrmTraining::new(model, rows, test, section, recipe.seed, &self.device)?;
        let names = ("prm", "eval/step_accuracy", "held-out step accuracy");
        let run = (&mut self.metrics, self.stall_timeout);
        let (driven, before, after) = classifier_stage(
            run,
            &mut trainer,
            crate::PrmTraining::test_accuracy,
            names,
            &checkpointing,
        )?;
        let outcome = ProcessRewardModelOutcome {
            steps: driven.steps,
            seconds: driven.elapsed.as_secs_f64(),
            rows: rows.len(),
            test_rows: test.len(),
            skipped: self.setup.skipped_rows,
            accuracy_before: before,
            accuracy_after: after,
        };
        Ok((trainer.model, outcome))
    }

    /// The checkpointing of the stage after SFT: it resumes only a checkpoint taken in that
    /// stage, and numbers its checkpoints after SFT's steps.
    fn after_sft_checkpointing(&self, stage: LmStage) -> Checkpointing {
        let resume = (self.resumed.as_ref())
            .filter(|(_, s)| matches!(s, LmStage::AfterSft { .. }))
            .map(|(c, _)| (*c).clone());
        let sft_steps = self.loaded.recipe.sft.as_ref().map_or(0, |s| s.steps);
        self.checkpointing(resume, sft_steps, stage)
    }

    /// The held-out evaluation of the trained `model`, logged after `steps` and printed after
    /// `label`.
    fn evaluate_after(
        &mut self,
        model: &CausalLm<B>,
        steps: usize,
        label: &str,
    ) -> Result<Option<EvalReport>, LmError> {
        let after = self.setup.evaluate(&model.valid(), self.loaded, &self.device)?;
        if let Some(report) = &after {
            log_eval(self.metrics.as_mut(), "after", steps, report)?;
            eprintln!("{label} {}", report.one_line());
        }
        Ok(after)
    }

    /// A stage's checkpointing: its checkpoints carry `stage` and are numbered after the
    /// `step_offset` steps of the stages before it.
    fn checkpointing(&self, resume: Option<Checkpoint>, step_offset: usize, stage: LmStage) -> Checkpointing {
        Checkpointing {
            resume,
            step_offset,
            context: vec![stage.section()],
            ..self.checkpointing.clone()
        }
    }
}

/// Writes `model` with the run's tokenizer (and a vision-language model's image processor) as a
/// Hugging Face model directory.
fn save_model_dir<B: ReinBackend, S: ReinBackend>(
    model: &CausalLm<B>,
    setup: &LmSetup<S>,
    dir: &Path,
) -> Result<(), LmError> {
    save(model, dir)?;
    setup.tokenizer.save(dir)?;
    if let Some(images) = &setup.images {
        images.copy_settings(dir)?;
    }
    Ok(())
}

/// Drives a classifier's `trainer` (reward models, process reward models) under
/// `checkpointing` and the watchdog's `stall_timeout`, its steps' records in `metrics` named
/// `stage`, its held-out `accuracy` logged as `metric` before (unless resuming) and after and
/// printed as `what`. Returns the driver's report and the accuracy before and after.
fn classifier_stage<T: Trainer<Error = LmError>>(
    (metrics, stall_timeout): (&mut Option<MetricsWriter>, Duration),
    trainer: &mut T,
    accuracy: impl Fn(&T) -> Option<f64>,
    (stage, metric, what): (&'static str, &str, &str),
    checkpointing: &Checkpointing,
) -> Result<(Driven, Option<f64>, Option<f64>), LmError> {
    let record = |when: &str, step: usize, accuracy: f64| {
        let mut record = json!({"stage": "eval", "when": when, "step": step});
        record[metric] = accuracy.into();
        record
    };
    let before = accuracy(trainer);
    if let (Some(metrics), false, Some(value)) = (metrics.as_mut(), checkpointing.resume.is_some(), before) {
        metrics.write(&record("before", 0, value))?;
    }
    let driven = Driver {
        metrics: metrics.as_mut(),
        checkpointing,
        stall_timeout,
        stage: Some(stage),
    }
    .run(trainer)?;
    let after = accuracy(trainer);
    if let (Some(metrics), Some(value)) = (metrics.as_mut(), after) {
        metrics.write(&record("after", trainer.total_steps(), value))?;
    }
    let pct = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.1}%", 100.0 * v));
    eprintln!("{what}: {} before, {} after", pct(before), pct(after));
    Ok((driven, before, after))
}

//! GRPO steps on a checkpoint with a reward scripted in Rust, for tests that watch what a step
//! does: each step's record and the parameters before and after.

#![allow(dead_code)]

use std::path::Path;

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use rein_core::{CompletionScore, Group, GroupScores, PluginError, RewardFn, StepScore};
use rein_model::lm::lora::LoraSpec;
use rein_model::lm::{CausalLm, LmTokenizer, load};
use rein_posttrain::rollout::episodes::Agent;
use rein_posttrain::{ImplicitPrm, OnlineContext, OnlineTrainer, Prompt, SignalReward, Update, WeightedReward};
use rein_recipe::{CurriculumSection, GrpoSection, ImplicitPrmSection, OptimizerSection, SamplerSection};
use rein_run::driver::{Record, Trainer};
use rein_run::watchdog::Phases;

pub type B = Autodiff<Flex>;

/// A reward computed in Rust from the prompt and the completion's index in its group, with step
/// scores computed from the completion's text when it has `steps`.
pub struct Scripted(pub fn(&str, usize) -> f64, pub Option<fn(&str) -> Vec<StepScore>>);

impl RewardFn for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }

    fn score(&mut self, groups: &[Group]) -> Result<Vec<GroupScores>, PluginError> {
        Ok(groups
            .iter()
            .map(|g| {
                (g.completions.iter().enumerate())
                    .map(|(i, completion)| CompletionScore {
                        score: Some((self.0)(&g.prompt, i)),
                        steps: self.1.map(|steps| steps(completion)).unwrap_or_default(),
                        ..CompletionScore::default()
                    })
                    .collect()
            })
            .collect())
    }
}

/// Every parameter's values, in visiting order.
pub fn parameters(model: &CausalLm<B>) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<Bk: Backend> ModuleVisitor<Bk> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Bk, D>>) {
            self.0
                .extend(param.val().into_data().convert::<f32>().to_vec::<f32>().unwrap());
        }
    }
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

/// What `steps` GRPO steps did: each step's record and the parameters before and after.
pub struct Trace {
    pub records: Vec<Record>,
    pub before: Vec<f32>,
    pub after: Vec<f32>,
}

impl Trace {
    pub fn value(&self, step: usize, key: &str) -> f64 {
        let record = &self.records[step - 1];
        record
            .get(key)
            .and_then(|v| v.as_f64())
            .unwrap_or_else(|| panic!("step {step}: no number `{key}` in {record:?}"))
    }

    pub fn moved(&self) -> bool {
        self.before != self.after
    }
}

/// A GRPO run to trace: `grpo.steps` steps on the prompts, each completion scored by `reward`
/// from its prompt and its index in its group.
pub struct Run<'a> {
    pub grpo: GrpoSection,
    pub sampler: SamplerSection,
    pub prompts: &'a [&'a str],
    pub reward: fn(&str, usize) -> f64,
    pub agent: Option<&'a mut Agent>,
    pub curriculum: Option<&'a CurriculumSection>,
    /// Devices each update splits the batch across (the CPU this many times).
    pub devices: usize,
    /// Train a LoRA adapter on the frozen model instead of the model.
    pub lora: Option<LoraSpec>,
    /// Label-free rewards from the sampler's certainty, added to `reward`.
    pub signals: &'a [SignalReward],
    /// Step scores of each completion, from its text, beside `reward`.
    pub steps: Option<fn(&str) -> Vec<StepScore>>,
    /// PRIME's implicit PRM, started from the model, learning beside it.
    pub implicit_prm: Option<ImplicitPrmSection>,
    /// Grow each group as a tree ([rollout] kind = "tree").
    pub tree: Option<rein_recipe::RolloutSection>,
}

impl Run<'_> {
    /// The run on the model at `dir` (a checkpoint directory or a `.gguf` file).
    pub fn trace(self, dir: &Path) -> Trace {
        let device = Default::default();
        let mut model = load::<B>(dir, &device).unwrap();
        if let Some(spec) = &self.lora {
            model = model.with_lora(spec, &mut rein_sampler::SeededRng::new(0), &device);
        }
        let tokenizer = LmTokenizer::load(dir, &model.config().eos_ids()).unwrap();
        let prompts: Vec<Prompt> = (self.prompts.iter())
            .map(|&text| Prompt {
                text: text.into(),
                tokens: tokenizer.encode(text).unwrap(),
                answer: None,
                target: None,
                target_trained: None,
                metadata: String::new(),
                // The first word is the prompt's source (what a UCB curriculum draws between).
                source: text.split(' ').next().unwrap_or_default().into(),
                images: Default::default(),
                image_files: Default::default(),
            })
            .collect();
        let mut rewards = [WeightedReward {
            reward: Box::new(Scripted(self.reward, self.steps)),
            weight: 1.0,
            isolate: false,
        }];
        // No weight decay: a step whose gradients are all zero leaves every parameter as it was.
        let optimizer = OptimizerSection {
            lr: 2e-2,
            weight_decay: 0.0,
            ..OptimizerSection::default()
        };
        let before = parameters(&model);
        let ctx = OnlineContext {
            tokenizer: &tokenizer,
            prompts: &prompts,
            rewards: &mut rewards,
            signals: self.signals,
            accuracy_reward: 0,
            curriculum: self.curriculum,
            rollout: rein_recipe::Rollout {
                tree: self.tree,
                ..self.grpo.rollout()
            },
            sampler: &self.sampler,
            optimizer: &optimizer,
            seed: 7,
            agent: self.agent,
        };
        let devices = rein_posttrain::data_parallel::devices(&device, self.devices);
        let implicit_prm =
            (self.implicit_prm.as_ref()).map(|section| ImplicitPrm::new(model.clone(), section, &optimizer));
        let mut algorithm = OnlineTrainer::new(model, ctx, Update::Grpo(&self.grpo), &device)
            .and_then(|trainer| trainer.with_devices(devices))
            .and_then(|trainer| match implicit_prm {
                Some(prm) => trainer.with_implicit_prm(prm),
                None => Ok(trainer),
            })
            .unwrap();
        let phases = Phases::new(Default::default(), Default::default());
        let records = (1..=self.grpo.steps)
            .map(|step| algorithm.step(step, &phases).unwrap().record)
            .collect();
        let after = parameters(algorithm.model());
        Trace { records, before, after }
    }
}

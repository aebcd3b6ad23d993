//! Where GRPO's completions come from, and how far ahead of training they may be made.
//!
//! A [`RolloutSource`] wraps a [`Generator`] (the native sampler or inference servers). The
//! trainer submits one job per step — the step's prompts, picked in step order — and takes
//! the completions back in the same order; after each update it publishes the new policy.
//!
//! - `max_staleness = 0`: jobs run on the trainer's thread when taken, after the policy of the
//!   previous update was handed to the generator: today's synchronous loop, bit for bit.
//! - `max_staleness = s > 0`: a producer thread runs the jobs as soon as they are submitted,
//!   each once the published policy is at least `step − 1 − s` (AReaL's and prime-rl's bound:
//!   no completion trains a policy more than `s` updates newer than the one that sampled it).
//!   Before each job it hands the generator the newest published policy, so a job's
//!   completions all come from one version, which they carry.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex};

use rein_model::ReinBackend;
use rein_model::lm::CausalLm;
use rein_model::vision::ProcessedImage;
use rein_sampler::{Generation, GenerationConfig, Generator, GeneratorError};

use crate::PromptPixels;
use crate::rollout::tree::{self, Grown, TreeJob};
use rein_optim::Branch;

/// One step's generation work.
pub struct Job {
    /// The step it is for.
    pub step: usize,
    /// The prompts, as token ids.
    pub prompts: Vec<Vec<u32>>,
    /// Per prompt, its images (empty for a text prompt; or no entries at all).
    pub images: Vec<PromptPixels>,
    /// Sampling settings (seed included).
    pub config: GenerationConfig,
    /// Stop strings.
    pub stops: Vec<String>,
    /// Grow each prompt's group as a tree ([`crate::rollout::tree`]), not `config.n` completions
    /// on their own.
    pub tree: Option<TreeJob>,
}

impl Job {
    /// Runs the job on `generator`, with the prompts' images when they have any.
    fn generate<B: ReinBackend>(&self, generator: &mut dyn Generator<B>) -> Result<Grown, GeneratorError> {
        let images: Vec<&[ProcessedImage]> = self.images.iter().map(|i| &i[..]).collect();
        match &self.tree {
            Some(tree) => tree::grow(generator, &self.prompts, &images, &self.config, &self.stops, tree),
            None => Ok(Grown {
                leaves: generator.generate_with_images(&self.prompts, &images, &self.config, &self.stops)?,
                branches: Vec::new(),
                fallback_branch_points: 0,
            }),
        }
    }
}

/// A job's completions.
pub struct Produced {
    /// The step they are for.
    pub step: usize,
    /// `config.n` per prompt, in order.
    pub generations: Vec<Generation>,
    /// Per generation of a tree rollout, the leaf of its group it branched from; empty for
    /// groups sampled on their own.
    pub branches: Vec<Option<Branch>>,
    /// A tree rollout's branch points its rule could not find, taken elsewhere.
    pub fallback_branch_points: usize,
    /// The version of the policy that sampled them.
    pub version: u64,
}

type Outcome = Result<Produced, GeneratorError>;

/// The newest policy the trainer published.
struct Published<B: ReinBackend> {
    policy: Option<CausalLm<B>>,
    version: u64,
    closed: bool,
}

type Shared<B> = Arc<(Mutex<Published<B>>, Condvar)>;

enum Mode<B: ReinBackend> {
    /// Jobs run on the trainer's thread when taken.
    Inline {
        generator: Box<dyn Generator<B>>,
        jobs: VecDeque<Job>,
    },
    /// Jobs run on a producer thread as soon as the staleness bound allows.
    Ahead {
        jobs: Sender<(Job, u64)>,
        results: Receiver<Outcome>,
        shared: Shared<B>,
    },
}

/// See the module docs.
pub struct RolloutSource<B: ReinBackend> {
    mode: Mode<B>,
    max_staleness: usize,
    description: String,
}

impl<B: ReinBackend> RolloutSource<B>
where
    CausalLm<B>: Send,
{
    /// A source over `generator`, which gets `policy` as version `version` before any job.
    pub fn new(
        mut generator: Box<dyn Generator<B>>,
        policy: &CausalLm<B>,
        version: u64,
        max_staleness: usize,
    ) -> Result<Self, GeneratorError> {
        let description = generator.describe();
        let mode = match max_staleness {
            0 => {
                generator.update(policy, version)?;
                Mode::Inline {
                    generator,
                    jobs: VecDeque::new(),
                }
            }
            _ => {
                let shared: Shared<B> = Arc::new((
                    Mutex::new(Published {
                        policy: Some(policy.clone()),
                        version,
                        closed: false,
                    }),
                    Condvar::new(),
                ));
                let (jobs, job_rx) = channel();
                let (result_tx, results) = channel();
                let producer_shared = shared.clone();
                std::thread::Builder::new()
                    .name("rein-generation".into())
                    .spawn(move || produce(generator, job_rx, result_tx, producer_shared))
                    .map_err(|e| GeneratorError::BadResponse {
                        url: description.clone(),
                        message: format!("could not start the generation thread: {e}"),
                    })?;
                Mode::Ahead { jobs, results, shared }
            }
        };
        Ok(Self {
            mode,
            max_staleness,
            description,
        })
    }

    /// How many steps ahead of training jobs may be submitted.
    pub fn max_staleness(&self) -> usize {
        self.max_staleness
    }

    /// What generates, for logs and stall messages.
    pub fn describe(&self) -> &str {
        &self.description
    }

    /// From now on jobs may use `policy`, version `version`.
    pub fn publish(&mut self, policy: &CausalLm<B>, version: u64) -> Result<(), GeneratorError> {
        match &mut self.mode {
            Mode::Inline { generator, .. } => generator.update(policy, version),
            Mode::Ahead { shared, .. } => {
                let (lock, ready) = &**shared;
                let mut published = lock.lock().unwrap_or_else(|e| e.into_inner());
                published.policy = Some(policy.clone());
                published.version = version;
                ready.notify_all();
                Ok(())
            }
        }
    }

    /// Queues `job`; its completions come from a policy of version ≥ `job.step − 1 −
    /// max_staleness`.
    pub fn submit(&mut self, job: Job) {
        let min_version = (job.step.saturating_sub(1)).saturating_sub(self.max_staleness) as u64;
        match &mut self.mode {
            Mode::Inline { jobs, .. } => jobs.push_back(job),
            Mode::Ahead { jobs, .. } => {
                // A closed channel means the producer ended; `take` reports why.
                let _ = jobs.send((job, min_version));
            }
        }
    }

    /// The oldest submitted job's completions, waiting for them if needed.
    pub fn take(&mut self) -> Outcome {
        match &mut self.mode {
            Mode::Inline { generator, jobs } => {
                let job = jobs.pop_front().ok_or(GeneratorError::NoPolicy)?;
                let grown = job.generate(generator.as_mut())?;
                Ok(Produced {
                    step: job.step,
                    generations: grown.leaves,
                    branches: grown.branches,
                    fallback_branch_points: grown.fallback_branch_points,
                    version: generator.version(),
                })
            }
            Mode::Ahead { results, .. } => results.recv().unwrap_or_else(|_| {
                Err(GeneratorError::BadResponse {
                    url: self.description.clone(),
                    message: "the generation thread ended".into(),
                })
            }),
        }
    }
}

impl<B: ReinBackend> Drop for RolloutSource<B> {
    fn drop(&mut self) {
        if let Mode::Ahead { shared, .. } = &self.mode {
            let (lock, ready) = &**shared;
            lock.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
            ready.notify_all();
        }
    }
}

/// The producer thread: each job once the policy is recent enough, on the newest policy.
fn produce<B: ReinBackend>(
    mut generator: Box<dyn Generator<B>>,
    jobs: Receiver<(Job, u64)>,
    results: Sender<Outcome>,
    shared: Shared<B>,
) {
    let mut synced: Option<u64> = None;
    while let Ok((job, min_version)) = jobs.recv() {
        let (policy, version) = {
            let (lock, ready) = &*shared;
            let mut published = lock.lock().unwrap_or_else(|e| e.into_inner());
            while !published.closed && published.version < min_version {
                published = ready.wait(published).unwrap_or_else(|e| e.into_inner());
            }
            if published.closed {
                return;
            }
            (published.policy.clone(), published.version)
        };
        let outcome = (|| {
            if synced != Some(version) {
                generator.update(policy.as_ref().ok_or(GeneratorError::NoPolicy)?, version)?;
                synced = Some(version);
            }
            let grown = job.generate(generator.as_mut())?;
            Ok(Produced {
                step: job.step,
                generations: grown.leaves,
                branches: grown.branches,
                fallback_branch_points: grown.fallback_branch_points,
                version,
            })
        })();
        let failed = outcome.is_err();
        if results.send(outcome).is_err() || failed {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use burn::backend::Flex;
    use rein_model::lm::{LmConfig, LmInit};
    use rein_sampler::FinishReason;

    use super::*;

    /// Answers every prompt with one token: the version of the policy it holds.
    struct Versions {
        version: u64,
        calls: Arc<AtomicUsize>,
    }

    impl Generator<Flex> for Versions {
        fn generate(
            &mut self,
            prompts: &[Vec<u32>],
            _: &GenerationConfig,
            _: &[String],
        ) -> Result<Vec<Generation>, GeneratorError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok((0..prompts.len())
                .map(|prompt| Generation {
                    prompt,
                    sample: 0,
                    tokens: vec![self.version as u32],
                    logprobs: vec![0.0],
                    top_logprobs: Vec::new(),
                    certainty: Vec::new(),
                    finish: FinishReason::Length,
                    routes: None,
                })
                .collect())
        }

        fn update(&mut self, _: &CausalLm<Flex>, version: u64) -> Result<(), GeneratorError> {
            self.version = version;
            Ok(())
        }

        fn version(&self) -> u64 {
            self.version
        }

        fn describe(&self) -> String {
            "versions".into()
        }
    }

    fn model() -> CausalLm<Flex> {
        let config = LmConfig::from_json(serde_json::json!({
            "model_type": "qwen2", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 8
        }))
        .unwrap();
        LmInit { config, std: 0.1 }.init::<Flex>(&mut rein_sampler::SeededRng::new(1), &Default::default())
    }

    fn job(step: usize) -> Job {
        Job {
            step,
            prompts: vec![vec![1]],
            images: Vec::new(),
            config: GenerationConfig::default(),
            stops: Vec::new(),
            tree: None,
        }
    }

    fn source(max_staleness: usize) -> (RolloutSource<Flex>, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let generator = Versions {
            version: u64::MAX,
            calls: calls.clone(),
        };
        (
            RolloutSource::new(Box::new(generator), &model(), 0, max_staleness).unwrap(),
            calls,
        )
    }

    /// Synchronous: each job samples from the policy published just before it.
    #[test]
    fn synchronous_jobs_use_the_latest_policy() {
        let (mut source, _) = source(0);
        let policy = model();
        for step in 1..=3 {
            source.submit(job(step));
            let produced = source.take().unwrap();
            assert_eq!((produced.step, produced.version), (step, step as u64 - 1));
            source.publish(&policy, step as u64).unwrap();
        }
    }

    /// With a staleness bound of 1, step 2's completions need no update (they may come from
    /// version 0), but step 3's wait for version 1 and come from it.
    #[test]
    fn generation_runs_ahead_by_at_most_max_staleness_versions() {
        let (mut source, calls) = source(1);
        source.submit(job(1));
        source.submit(job(2));
        let first = source.take().unwrap();
        let second = source.take().unwrap();
        assert_eq!((first.step, first.version), (1, 0));
        assert_eq!((second.step, second.version), (2, 0), "step 2 may run on version 0");
        assert_eq!(second.generations[0].tokens, vec![0]);
        source.submit(job(3));
        // Step 3 needs version ≥ 1, which is not published: the producer must wait.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(calls.load(Ordering::SeqCst), 2, "step 3 ran before version 1 existed");
        source.publish(&model(), 1).unwrap();
        let third = source.take().unwrap();
        assert_eq!((third.step, third.version), (3, 1));
        assert_eq!(third.generations[0].tokens, vec![1]);
    }
}

//! What a recipe may contain. Every section rejects unknown keys; every key has a default
//! unless a recipe must choose it.

use rein_core::SandboxLimits;

pub use crate::dpo::DpoSection;
pub use crate::grpo::GrpoSection;
pub use crate::kto::KtoSection;
pub use crate::lm_ppo::LmPpoSection;
pub use crate::off_policy::{SacSection, Td3Section};
pub use crate::online_dpo::OnlineDpoSection;
pub use crate::ppo::PpoSection;
pub use crate::process_reward_model::ProcessRewardModelSection;
pub use crate::reward_model::RewardModelSection;
pub use crate::sampler::SamplerSection;
pub use crate::sft::SftSection;
use serde::{Deserialize, Serialize};

/// A resolved recipe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// Name of the run (defaults to the recipe's file name); run directories start with it.
    #[serde(default)]
    pub name: Option<String>,
    /// Seed for everything random: model init, environments, sampling, minibatches.
    #[serde(default = "defaults::seed")]
    pub seed: u64,
    /// `cpu` (burn Flex) or `cuda` (burn-cuda, when built with `--features cuda`).
    #[serde(default)]
    pub device: Device,
    /// The algorithm and its hyperparameters.
    pub algorithm: Algorithm,
    /// The environment (for PPO on environments).
    #[serde(default)]
    pub env: Option<EnvSection>,
    /// The network.
    #[serde(default)]
    pub model: ModelSection,
    /// The optimiser.
    #[serde(default)]
    pub optimizer: OptimizerSection,
    /// Length of training, stopping, evaluation, logging.
    #[serde(default)]
    pub train: TrainSection,
    /// Prompts (language-model recipes): files, or a task rein generates.
    #[serde(default)]
    pub data: Option<DataSection>,
    /// Supervised fine-tuning before RL (language-model recipes).
    #[serde(default)]
    pub sft: Option<SftSection>,
    /// How completions are sampled (language-model recipes).
    #[serde(default)]
    pub sampler: SamplerSection,
    /// Reward plugins, summed with their weights (language-model recipes).
    #[serde(default)]
    pub reward: Vec<RewardEntry>,
    /// Held-out evaluation (language-model recipes).
    #[serde(default)]
    pub eval: EvalSection,
    /// Train LoRA adapters instead of every weight (language-model recipes).
    #[serde(default)]
    pub lora: Option<LoraSection>,
    /// Tool plugins the model may call (multi-turn language-model recipes).
    #[serde(default)]
    pub tool: Vec<PluginEntry>,
    /// Multi-turn episodes: turn and token limits, and a text environment.
    #[serde(default)]
    pub agent: Option<AgentSection>,
    /// On-policy distillation: a teacher whose per-token log-probabilities join GRPO's
    /// advantages.
    #[serde(default)]
    pub teacher: Option<TeacherSection>,
    /// PRIME's implicit process reward model, trained online beside the policy: its token
    /// rewards join the process advantage.
    #[serde(default)]
    pub implicit_prm: Option<crate::ImplicitPrmSection>,
    /// Which prompts GRPO batches draw: difficulty pools.
    #[serde(default)]
    pub curriculum: Option<crate::CurriculumSection>,
    /// How GRPO samples each group: its completions on their own, or as a tree.
    #[serde(default)]
    pub rollout: Option<crate::RolloutSection>,
}

/// A plugin with its config and sandbox limits (a tool, a text environment).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginEntry {
    /// Plugin name (`target/plugins/<name>.wasm`) or a path to a `.wasm` file.
    pub plugin: String,
    /// The plugin's config (passed as JSON).
    #[serde(default)]
    pub config: toml::Table,
    /// Sandbox limits.
    #[serde(default)]
    pub limits: SandboxLimits,
}

/// Multi-turn episodes: the model's turns alternate with tool results or a text environment's
/// messages until the model answers without a tool call, the environment says done, or a limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentSection {
    /// Most model turns per episode.
    pub max_turns: usize,
    /// Most tokens per episode after the prompt (the model's and the environment's).
    pub max_tokens: usize,
    /// A text environment plugin that opens episodes and answers the model's turns.
    pub env: Option<PluginEntry>,
}

impl Default for AgentSection {
    fn default() -> Self {
        Self {
            max_turns: 4,
            max_tokens: 512,
            env: None,
        }
    }
}

/// Where tensors live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// burn's Flex CPU backend.
    #[default]
    Cpu,
    /// burn-cuda (GPU 0).
    Cuda,
}

/// The algorithm, selected by `algorithm.name`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "lowercase", deny_unknown_fields)]
pub enum Algorithm {
    /// Proximal policy optimisation on vector environments.
    Ppo(PpoSection),
    /// The GRPO family on a language model with reward plugins.
    Grpo(GrpoSection),
    /// Supervised fine-tuning only.
    Sft(SftSection),
    /// The DPO family on preference pairs (offline).
    Dpo(DpoSection),
    /// KTO on completions labelled desirable or undesirable (offline).
    Kto(KtoSection),
    /// A Bradley–Terry reward model trained on preference pairs.
    #[serde(rename = "reward-model")]
    RewardModel(RewardModelSection),
    /// A process reward model (a token classifier) trained on step labels.
    Prm(ProcessRewardModelSection),
    /// Online (iterative) DPO: pairs sampled from the policy and ranked by the rewards.
    #[serde(rename = "online-dpo")]
    OnlineDpo(OnlineDpoSection),
    /// PPO with a critic on a language model: `name = "ppo"` in a recipe with `[data]`.
    #[serde(rename(serialize = "ppo", deserialize = "lm-ppo"))]
    LmPpo(LmPpoSection),
    /// Soft actor-critic on vector environments with continuous actions.
    Sac(SacSection),
    /// TD3 on vector environments with continuous actions.
    Td3(Td3Section),
}

/// The tag [`Algorithm::LmPpo`] is read under (recipes write `"ppo"`; see
/// `with_lm_ppo_tag`).
pub(crate) const LM_PPO_TAG: &str = "lm-ppo";

/// The environment plugin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvSection {
    /// Plugin name (`target/plugins/<name>.wasm`) or a path to a `.wasm` file.
    pub plugin: String,
    /// Environments stepped together.
    #[serde(default = "defaults::num_envs")]
    pub num_envs: usize,
    /// The plugin's own config (passed to it as JSON).
    #[serde(default)]
    pub config: toml::Table,
    /// Sandbox limits for the plugin.
    #[serde(default)]
    pub limits: SandboxLimits,
}

/// The network: an MLP actor-critic (PPO) or a language model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// Hidden layer widths (MLP).
    pub hidden: Vec<usize>,
    /// `tanh` or `relu` (MLP).
    pub activation: rein_core::Activation,
    /// Initial log standard deviation of a Gaussian policy (MLP).
    pub init_log_std: f32,
    /// A Hugging Face model directory or `.gguf` file to start from (language model; relative
    /// to the recipe), or the name of a model fetched with `cargo xtask model NAME`.
    pub path: Option<String>,
    /// Or a `config.json`-style architecture to initialise from scratch (language model).
    pub architecture: Option<toml::Table>,
    /// Standard deviation of from-scratch weights.
    pub init_std: f64,
    /// The tokenizer directory (`tokenizer.json`, `tokenizer_config.json`); defaults to the
    /// model directory.
    pub tokenizer: Option<String>,
    /// A Jinja chat template file (relative to the recipe) that replaces the tokenizer's: a
    /// format for a base model that has none, or the recipe's own (TRL's
    /// `chat_template_path`). Saved with every model the run writes.
    pub chat_template: Option<String>,
    /// PPO, SAC, TD3: burn modules through autodiff (the reference) instead of flat buffers with
    /// gradients by hand (the CPU's default, several times faster; equal up to rounding).
    pub autodiff: bool,
    /// The dtype the language model's decoder layers multiply in: `f32`, or `bf16` (mixed
    /// precision when it trains: see [`TrainSection::precision`]). Absent: `bf16` when
    /// `train.precision = "mixed"`, else `f32`.
    pub dtype: Option<rein_core::ModelDtype>,
    /// An image side to add to the model, initialised from scratch (a vision-language model
    /// trained from scratch, or a language model given eyes): the SigLIP encoder's
    /// `vision_config` keys (`hidden_size`, `intermediate_size`, `num_hidden_layers`,
    /// `num_attention_heads`, `image_size`, `patch_size`) and Idefics3's `scale_factor`. Its
    /// image processor's settings are read beside the tokenizer.
    pub vision: Option<toml::Table>,
    /// A vision-language model: train its vision encoder too. By default it stays frozen (the
    /// connector and the decoder learn), as TRL's and verl's VLM recipes freeze the vision
    /// tower.
    pub train_vision_encoder: bool,
}

impl Recipe {
    /// Whether a `[[reward]]` can judge an answer correct (a plugin or a reward model, which
    /// `eval.accuracy_reward` names; a `signal` judges none).
    pub fn judges_answers(&self) -> bool {
        self.reward.iter().any(|r| r.signal.is_none())
    }

    /// Whether PPO, SAC and TD3 train flat networks: on the CPU, unless `model.autodiff`.
    pub fn flat_networks(&self) -> bool {
        self.device == Device::Cpu && !self.model.autodiff
    }

    /// The dtype the language model multiplies in: `model.dtype`, else bf16 when
    /// `train.precision = "mixed"`, else `f32` (validation refuses the two disagreeing).
    pub fn model_dtype(&self) -> rein_core::ModelDtype {
        use rein_core::{ModelDtype, TrainPrecision};
        match (self.model.dtype, self.train.precision) {
            (Some(dtype), _) => dtype,
            (None, Some(TrainPrecision::Mixed)) => ModelDtype::Bf16,
            (None, _) => ModelDtype::F32,
        }
    }
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            hidden: vec![64, 64],
            activation: rein_core::Activation::Tanh,
            init_log_std: 0.0,
            path: None,
            architecture: None,
            init_std: 0.02,
            tokenizer: None,
            chat_template: None,
            autodiff: false,
            dtype: None,
            vision: None,
            train_vision_encoder: false,
        }
    }
}

/// Where prompts come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSection {
    /// Generate the data: a synthetic task (`[data.task]`).
    #[serde(default)]
    pub task: Option<crate::ArithmeticTask>,
    /// Or generate a visual task for a vision-language model (`[data.shapes_task]`).
    #[serde(default)]
    pub shapes_task: Option<crate::ShapesTask>,
    /// Training prompts (`.jsonl` or `.parquet`, relative to the recipe).
    #[serde(default)]
    pub train: Option<String>,
    /// Held-out prompts.
    #[serde(default)]
    pub test: Option<String>,
    /// Column names.
    #[serde(default)]
    pub fields: crate::Fields,
    /// Wrap prompts in the tokenizer's chat template (when it has one).
    #[serde(default = "defaults::yes")]
    pub chat_template: bool,
    /// A system message before each prompt (with the chat template).
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// Variables the chat template sees besides the messages, as TRL's `chat_template_kwargs`
    /// (`{ enable_thinking = false }` for Qwen3's template).
    #[serde(default, skip_serializing_if = "toml::Table::is_empty")]
    pub chat_template_kwargs: toml::Table,
}

/// LoRA adapters: the base weights stay frozen, `(α/r)·A·B` learns per adapted linear layer.
/// The run saves the adapters in PEFT's format (`<run>/adapter/`) and the merged model
/// (`<run>/final/`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoraSection {
    /// `r`, the rank of each update.
    pub rank: usize,
    /// `α`; the update is scaled by `α/r`.
    pub alpha: f32,
    /// Dropout on the adapters' inputs while training.
    pub dropout: f64,
    /// Linear layers to adapt (`q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`,
    /// `down_proj`), or `all-linear`.
    pub targets: Vec<String>,
    /// Scale by `α/√r` (rsLoRA) instead of `α/r`.
    pub rslora: bool,
    /// A vision-language model's vision encoder gets adapters too, on every linear layer of
    /// its blocks (its base weights frozen with the rest).
    pub vision: bool,
}

impl Default for LoraSection {
    /// PEFT's defaults (rank 8, α 8, no dropout), on every linear layer as "LoRA Without
    /// Regret" recommends.
    fn default() -> Self {
        Self {
            rank: 8,
            alpha: 8.0,
            dropout: 0.0,
            targets: vec!["all-linear".into()],
            rslora: false,
            vision: false,
        }
    }
}

/// One reward in the sum: a sandboxed plugin, a reward model, or a signal of the sampler's own
/// (set exactly one of `plugin`, `model` and `signal`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardEntry {
    /// Plugin name (`target/plugins/<name>.wasm`) or a path to a `.wasm` file.
    #[serde(default)]
    pub plugin: Option<String>,
    /// A reward model: a model directory in Hugging Face format (or a fetched model's name)
    /// holding a `*ForSequenceClassification`.
    #[serde(default)]
    pub model: Option<String>,
    /// A label-free reward the host computes from the sampler's statistics of each completion:
    /// `self_certainty` or `negative_entropy`.
    #[serde(default)]
    pub signal: Option<rein_core::SamplerSignal>,
    /// What the model is: `classifier` (a sequence classifier's score) or `prm` (a causal LM
    /// judging each step, Math-Shepherd's convention; see `prm`).
    #[serde(default)]
    pub kind: RewardModelKind,
    /// How a `kind = "prm"` model reads the steps and how their scores make the reward.
    #[serde(default)]
    pub prm: Option<rein_core::PrmSettings>,
    /// The classifier's output that is the score, by its name in `id2label` (default: the first,
    /// as TRL reads `logits[:, 0]`).
    #[serde(default)]
    pub label: Option<String>,
    /// Completions a reward model scores per forward pass (per request, on a server).
    #[serde(default = "defaults::reward_batch")]
    pub batch_size: usize,
    /// A server that runs the reward model (`http://host:port`: vLLM, SGLang, `rein serve`),
    /// asked through the classification API (`/classify`) instead of running it in process;
    /// `model` still names its directory, for the chat template, tokenizer and labels.
    #[serde(default)]
    pub url: Option<String>,
    /// The reward model's name on the server `url` (default: none sent, the server's only model).
    #[serde(default)]
    pub served_model: Option<String>,
    /// The reward's name in metrics and errors (default: the plugin's name, or the model
    /// directory's).
    #[serde(default)]
    pub name: Option<String>,
    /// Weight in the sum.
    #[serde(default = "defaults::one")]
    pub weight: f64,
    /// The plugin's config (passed as JSON).
    #[serde(default)]
    pub config: toml::Table,
    /// Sandbox limits.
    #[serde(default)]
    pub limits: SandboxLimits,
    /// A judge model this reward plugin may ask (plugins built for the `reward-with-judge`
    /// world), with its budget.
    #[serde(default)]
    pub judge: Option<JudgeEntry>,
    /// The reward judges each completion on its own: when a batch fails, retry the failing
    /// group one completion at a time and score 0 the completions that fail alone (a hostile
    /// completion then costs only its own score; `on_error` is not consulted).
    #[serde(default)]
    pub isolate: bool,
    /// The reward sees each completion without its `<think>…</think>` block (the text after
    /// `</think>`), as a reasoning parser would hand the answer on.
    #[serde(default)]
    pub strip_thinking: bool,
}

/// The judge model granted to a reward plugin (`judge = { model = "…", max_new_tokens = 64 }`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(try_from = "toml::Table")]
pub struct JudgeEntry {
    /// A model directory in Hugging Face format (or a fetched model's name), run in process;
    /// without it, the policy's own model as the run starts (frozen). With `url`, the name the
    /// server knows the model by.
    #[serde(default)]
    pub model: Option<String>,
    /// An inference server (`http://host:port`: vLLM, SGLang, `rein serve`) asked through
    /// OpenAI's chat completions, instead of a model in process.
    #[serde(default)]
    pub url: Option<String>,
    /// The budget and sampling defaults: the table's other keys.
    #[serde(flatten)]
    pub limits: rein_core::JudgeLimits,
}

impl TryFrom<toml::Table> for JudgeEntry {
    type Error = String;

    /// `model`, and the rest as [`rein_core::JudgeLimits`], refusing unknown keys (serde's
    /// `flatten` would let them through).
    fn try_from(mut table: toml::Table) -> Result<Self, String> {
        let mut string = |key: &str| match table.remove(key) {
            None => Ok(None),
            Some(toml::Value::String(value)) => Ok(Some(value)),
            Some(other) => Err(format!("`{key}` must be a string, got {other}")),
        };
        let (model, url) = (string("model")?, string("url")?);
        let limits = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| e.message().to_string())?;
        Ok(Self { model, url, limits })
    }
}

/// On-policy distillation's teacher (`[teacher]`): each sampled token's advantage gains
/// `coef · (log π_teacher − log π_student)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeacherSection {
    /// A model directory in Hugging Face format (or a fetched model's name) sharing the
    /// policy's tokenizer.
    pub model: String,
    /// The term's weight against the rewards' advantage (`sampled`) or the policy loss (`full`).
    #[serde(default = "defaults::one")]
    pub coef: f64,
    /// How the reverse KL to the teacher is estimated: `sampled` (the default) or `full`.
    #[serde(default)]
    pub kl: TeacherKl,
}

/// The reverse KL to the teacher, estimated on the sampled token or summed over the vocabulary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TeacherKl {
    /// Each sampled token's advantage gains `coef · (log π_teacher − log π_student)` of that
    /// token (Thinking Machines' on-policy distillation, as Tinker, verl and slime compute it).
    #[default]
    Sampled,
    /// `coef ·` the reverse KL summed over the whole vocabulary at each completion position,
    /// averaged over the batch's tokens, added to the loss (TRL's `DistillationTrainer` with
    /// β = 1). Exact per position; holds both models' logits at every completion token.
    Full,
}

/// What a reward model computes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RewardModelKind {
    /// A sequence classifier (a reward model): the score head's output at the last token.
    #[default]
    Classifier,
    /// A process reward model: a causal LM that scores each step by the probability of its
    /// `good` token against its `bad` one after the step's tag (Math-Shepherd).
    Prm,
}

/// Held-out evaluation: greedy pass@1, sampled pass@k and maj@k.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EvalSection {
    /// Samples per prompt for pass@k and maj@k (0 = greedy only).
    pub k: usize,
    /// Sampling temperature for pass@k and maj@k (default: the sampler's, so pass@k measures
    /// the policy as it is trained).
    pub temperature: Option<f32>,
    /// Evaluate on at most this many held-out prompts.
    pub max_examples: Option<usize>,
    /// The reward that decides correctness (default: the first `[[reward]]`); a completion is
    /// correct when its `correct` component is 1, or else its score is positive.
    pub accuracy_reward: Option<String>,
    /// A majority-vote plugin for maj@k (e.g. `majority-vote`); none skips maj@k.
    pub majority_plugin: Option<String>,
}

impl Default for EvalSection {
    fn default() -> Self {
        Self {
            k: 4,
            temperature: None,
            max_examples: None,
            accuracy_reward: None,
            majority_plugin: Some("majority-vote".into()),
        }
    }
}

/// Adam with global gradient clipping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OptimizerSection {
    /// Learning rate.
    pub lr: f64,
    /// Anneal the learning rate linearly to 0 over the run (default: yes for PPO, no for GRPO;
    /// `recipe show` prints the value in effect).
    pub anneal_lr: Option<bool>,
    /// Adam ε.
    pub eps: f32,
    /// Adam β₁.
    pub beta1: f32,
    /// Adam β₂.
    pub beta2: f32,
    /// Clip the global gradient norm to this.
    pub max_grad_norm: f32,
    /// Decoupled weight decay (AdamW; language-model recipes).
    pub weight_decay: f32,
}

impl Default for OptimizerSection {
    fn default() -> Self {
        Self {
            lr: 2.5e-4,
            anneal_lr: None,
            eps: 1e-5,
            beta1: 0.9,
            beta2: 0.999,
            max_grad_norm: 0.5,
            weight_decay: 0.0,
        }
    }
}

/// How long to train and what to record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainSection {
    /// Environment steps in total (all envs).
    pub total_steps: u64,
    /// Stop once the mean return of the last `return_window` episodes reaches this.
    pub stop_at_return: Option<f64>,
    /// Episodes in the moving mean return.
    pub return_window: usize,
    /// Episodes of the deterministic policy to evaluate at the end.
    pub eval_episodes: usize,
    /// Directory for run directories.
    pub runs_dir: String,
    /// Write a checkpoint every this many optimisation steps (PPO updates, SFT or GRPO steps),
    /// and after the last; 0 = only on Ctrl-C. A killed run resumes from the newest.
    pub checkpoint_every: usize,
    /// Seconds one phase of a step (generating, scoring, stepping environments, a backward
    /// pass, writing a checkpoint) may run before the watchdog stops the run, naming the phase,
    /// after saving the last completed step.
    pub stall_timeout_s: f64,
    /// Devices each batch is split across, gradients summed by an all-reduce (data
    /// parallelism; SFT and the GRPO family): `cuda:0..N` on a GPU machine, the CPU `N` times
    /// on the CPU.
    pub devices: usize,
    /// Where metrics go: `jsonl` (`metrics.jsonl`, always: it is how a run resumes and is
    /// drawn) and `tensorboard` (event files under `tb/`).
    pub log: Vec<LogFormat>,
    /// A language model's training precision: `f32`, or `mixed` (`f32` master weights,
    /// gradients and optimiser state; products in bf16, as `model.dtype = "bf16"`). Absent:
    /// `mixed` when `model.dtype = "bf16"`, else `f32`.
    pub precision: Option<rein_core::TrainPrecision>,
}

/// A metrics format a run writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// `metrics.jsonl`, one JSON object per step.
    Jsonl,
    /// TensorBoard event files under `tb/`.
    Tensorboard,
}

impl TrainSection {
    /// Whether the run writes TensorBoard event files.
    pub fn tensorboard(&self) -> bool {
        self.log.contains(&LogFormat::Tensorboard)
    }
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            total_steps: 100_000,
            stop_at_return: None,
            return_window: 20,
            eval_episodes: 10,
            runs_dir: "runs".into(),
            checkpoint_every: 10,
            stall_timeout_s: 600.0,
            devices: 1,
            log: vec![LogFormat::Jsonl, LogFormat::Tensorboard],
            precision: None,
        }
    }
}

mod defaults {
    pub fn yes() -> bool {
        true
    }
    pub fn one() -> f64 {
        1.0
    }
    pub fn reward_batch() -> usize {
        16
    }
    pub fn seed() -> u64 {
        1
    }
    pub fn num_envs() -> usize {
        8
    }
}

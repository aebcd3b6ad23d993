//! `cargo xtask bench preferences`, its second case: one step of PPO with a critic on a language
//! model (rein's `algorithm.name = "ppo"` with `[data]`) against TRL's `PPOTrainer`
//! (`benches/peers/trl_ppo.py`) on the same checkpoints, prompts and settings: the random ~3M
//! Qwen2 as the policy (and its reference), another random ~3M Qwen2 with a one-score head as
//! the reward model and the value model's start (TRL's default); 8 prompts × 1 completion of up
//! to 32 tokens at temperature 0.7, 4 PPO epochs over one minibatch, TRL's defaults for the rest.
//! A step is generation, scoring, the reference's and the critic's passes, and the epochs, on
//! both sides; seconds per step (the true median after one untimed step) and peak memory.

use std::path::{Path, PathBuf};

use rein_model::lm::{LmTokenizer, SequenceClassifier, save};
use rein_model::{Cpu, CpuAutodiff};
use rein_posttrain::{Critic, OnlineContext, OnlineTrainer, PpoCritic, Update, WeightedReward};
use rein_recipe::{LmPpoSection, OptimizerSection, SamplerSection};
use rein_run::memory::reset_peak_rss;
use rein_sampler::ModelReward;

use crate::grpo::{WARMUP, arithmetic_prompts, column, drive};
use crate::qwen2_3m::{qwen2_3m, qwen2_3m_from};
use crate::report::{Report, Row, median, peak_rss_mib};

const STEPS: usize = 3;
const BATCH: usize = 8;
const MAX_TOKENS: usize = 32;
const LR: f64 = 1e-5;

pub fn run(report: &mut Report) -> anyhow::Result<()> {
    let device = Default::default();
    reset_peak_rss();
    let work = PathBuf::from("target/bench/ppo-lm");
    let _ = std::fs::remove_dir_all(&work);
    let tokenizer = LmTokenizer::load(Path::new("recipes/assets/arithmetic-tokenizer"), &[])?;
    let policy = qwen2_3m::<CpuAutodiff>(&device)?;
    let (policy_dir, reward_dir) = (work.join("policy"), work.join("reward-model"));
    save(&policy, &policy_dir)?;
    tokenizer.save(&policy_dir)?;
    let pad = tokenizer.pad_id();
    let mut rng = rein_core::SeededRng::new(3);
    SequenceClassifier::from_decoder(qwen2_3m_from::<Cpu>(2, &device)?, pad, 0.02, &mut rng, &device)
        .save(&reward_dir)?;
    tokenizer.save(&reward_dir)?;
    let prompts = arithmetic_prompts(&tokenizer, None)?;
    let mut lines = String::new();
    for prompt in prompts.iter().take(BATCH * (WARMUP + STEPS)) {
        lines += &format!(
            "{}\n",
            serde_json::json!({"prompt": tokenizer.decode(&prompt.tokens, false)?})
        );
    }
    std::fs::write(work.join("prompts.jsonl"), lines)?;

    println!(
        "PPO with a critic, 3M Qwen2 policy and 3M reward/value model: {WARMUP} + {STEPS} steps of {BATCH} prompts × 1 completion × up to {MAX_TOKENS} tokens, 4 epochs"
    );
    let reward = ModelReward::<Cpu>::load("reward-model", &reward_dir, None, 64, &device)?;
    let mut rewards = vec![WeightedReward {
        reward: Box::new(reward),
        weight: 1.0,
        isolate: false,
    }];
    let ppo = LmPpoSection {
        steps: WARMUP + STEPS,
        prompts_per_step: BATCH,
        ..LmPpoSection::default()
    };
    let sampler = SamplerSection {
        max_new_tokens: MAX_TOKENS,
        n: 1,
        temperature: 0.7,
        ..SamplerSection::default()
    };
    let optimizer = OptimizerSection {
        lr: LR,
        weight_decay: 0.0,
        max_grad_norm: 1.0,
        eps: 1e-8,
        ..OptimizerSection::default()
    };
    let ctx = OnlineContext {
        tokenizer: &tokenizer,
        prompts: &prompts,
        rewards: &mut rewards,
        signals: &[],
        accuracy_reward: 0,
        curriculum: None,
        rollout: ppo.rollout(),
        sampler: &sampler,
        optimizer: &optimizer,
        seed: 1,
        agent: None,
    };
    let loading_rss = peak_rss_mib();
    let critic =
        Critic::from_reward_model(SequenceClassifier::open(&reward_dir, &device)?).map_err(anyhow::Error::msg)?;
    let update = Update::Ppo(Box::new(PpoCritic::new(critic, &ppo, &optimizer)));
    let mut trainer = OnlineTrainer::new(policy, ctx, update, &device)?;
    let (driven, rss, records) = drive(&mut trainer, &work.join("runs"), loading_rss)?;
    let times = column(&records, "time/step_s");
    anyhow::ensure!(times.len() == STEPS, "{} timed steps logged", times.len());
    let seconds = median(&times).unwrap_or(f64::NAN);
    let lengths = column(&records, "train/completion_length");
    let phase = |name: &str| driven.phases.get(name).map_or(0.0, |d| d.as_secs_f64()) / (WARMUP + STEPS) as f64;
    println!(
        "  rein: {seconds:.3} s per step (generate {:.3}, reward {:.3}, reference {:.3}, values {:.3}, forward {:.3}, backward {:.3}, optimizer {:.3} s), mean completion {:.1} tokens, peak RSS {:.0} MiB",
        phase("generate"),
        phase("reward"),
        phase("reference"),
        phase("values"),
        phase("forward"),
        phase("backward"),
        phase("optimizer"),
        lengths.iter().sum::<f64>() / lengths.len().max(1) as f64,
        rss.unwrap_or(f64::NAN)
    );

    let name = format!("PPO step with a critic, 3M Qwen2, {BATCH} completions, ≤{MAX_TOKENS} tokens (s)");
    let (label, theirs, their_rss) = match trl_peer(&work) {
        Ok(measured) => measured,
        Err(reason) => {
            report.not_measured(name, "TRL", reason);
            return Ok(());
        }
    };
    report.push(Row {
        name,
        value: seconds,
        unit: "s",
        baseline: Some((label.clone(), theirs)),
        target: Some((format!("≥ 2× TRL ({:.2}×)", theirs / seconds), 2.0 * seconds <= theirs)),
    });
    if let (Some(ours), Some(their_rss)) = (rss, their_rss) {
        report.push(Row {
            name: "PPO step with a critic, peak resident memory (MiB)".into(),
            value: ours,
            unit: "MiB",
            baseline: Some((label, their_rss)),
            target: Some(("≤ TRL's".into(), ours <= their_rss)),
        });
    }
    Ok(())
}

/// TRL's `PPOTrainer` on the same checkpoints and prompts: its label, seconds per step and
/// peak resident memory, or why it could not run. Its loop never turns gradient checkpointing
/// on (it is not `Trainer.train`), so there is one row, as its users run it.
fn trl_peer(work: &Path) -> Result<(String, f64, Option<f64>), String> {
    println!("  TRL PPOTrainer on the same checkpoints and prompts (benches/peers/trl_ppo.py)");
    let args = vec![
        work.join("policy").display().to_string(),
        work.join("reward-model").display().to_string(),
        work.join("prompts.jsonl").display().to_string(),
        format!("--warmup={WARMUP}"),
        format!("--steps={STEPS}"),
        format!("--batch={BATCH}"),
        format!("--max-tokens={MAX_TOKENS}"),
        format!("--lr={LR}"),
        format!("--output-dir={}", work.join("trl").display()),
    ];
    crate::peers::trl_step("trl_ppo.py", args, "TRL", false)
}

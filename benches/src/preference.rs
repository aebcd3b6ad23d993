//! `cargo xtask bench preferences`: one DPO step (the sigmoid loss, β = 0.1) of the random ~3M
//! Qwen2 on 8 generated arithmetic preference pairs, the reference's log-probabilities computed
//! on every batch (rein's `precompute_ref = false`, TRL's default), against TRL's `DPOTrainer`
//! on the same checkpoint and pairs (`benches/peers/trl_dpo.py`), without gradient
//! checkpointing and with it (TRL's default); seconds per step and peak resident memory.

use std::path::Path;

use rein_model::CpuAutodiff;
use rein_model::lm::{LmTokenizer, save};
use rein_posttrain::{Dpo, generate_task, pairs_from_examples, prepare_preferences, slipped_solution};
use rein_recipe::{DataSection, DpoSection};
use rein_run::driver::Trainer;
use rein_run::memory::{peak_rss_mib, reset_peak_rss};
use rein_run::watchdog::Phases;

use crate::qwen2_3m::qwen2_3m;
use crate::report::{Report, Row, median};

/// Timed steps, after [`WARMUP`] untimed ones, on both sides.
const STEPS: usize = 10;
const WARMUP: usize = 1;
const BATCH: usize = 8;
const LR: f64 = 1e-6;

pub fn run() -> anyhow::Result<Report> {
    let device = Default::default();
    reset_peak_rss();
    let model = qwen2_3m::<CpuAutodiff>(&device)?;
    let tokenizer = LmTokenizer::load(Path::new("recipes/assets/arithmetic-tokenizer"), &[])?;
    let dir = Path::new("target/bench/dpo-policy");
    save(&model, dir)?;
    tokenizer.save(dir)?;

    // Two-digit sums and differences, the worked solution against one with a slipped step;
    // plain text (no chat template), so that both sides tokenize the same strings.
    let task: rein_recipe::ArithmeticTask = serde_json::from_value(serde_json::json!({"train": 200, "test": 0}))?;
    let mut rng = rein_core::SeededRng::new(1);
    let examples = pairs_from_examples(&generate_task(&task, 1).0, |e| slipped_solution(&e.prompt, &mut rng));
    let data: DataSection = serde_json::from_value(serde_json::json!({"chat_template": false}))?;
    let (pairs, _) = prepare_preferences(&examples, &tokenizer, &data, 1024)?;
    let mut lines = String::new();
    for e in &examples {
        let row = serde_json::json!({"prompt": e.prompt[0].content, "chosen": e.chosen, "rejected": e.rejected});
        lines += &format!("{row}\n");
    }
    std::fs::write(dir.join("pairs.jsonl"), lines)?;

    let section = DpoSection {
        steps: WARMUP + STEPS,
        batch_size: BATCH,
        lr: LR,
        warmup_steps: 0,
        precompute_ref: false,
        ..DpoSection::default()
    };
    let pad = tokenizer.pad_id().unwrap_or(0);
    let tokens: usize = pairs
        .iter()
        .take(BATCH)
        .map(|p| 2 * p.prompt.len() + p.chosen.len() + p.rejected.len())
        .sum();
    println!("DPO on the random 3M Qwen2, {BATCH} pairs per step (~{tokens} tokens per step, policy and reference)");
    let loading_rss = peak_rss_mib();
    let mut trainer = Dpo::new(model, &pairs, pad, &section, 1, &device)?;
    let phases = Phases::new(Default::default(), Default::default());
    let mut times = Vec::with_capacity(STEPS);
    for step in 1..=WARMUP + STEPS {
        let start = std::time::Instant::now();
        trainer.step(step, &phases)?;
        if step > WARMUP {
            times.push(start.elapsed().as_secs_f64());
        }
    }
    let seconds = median(&times).unwrap_or(f64::NAN);
    let rss = [loading_rss, peak_rss_mib()].into_iter().flatten().reduce(f64::max);
    let phase = |name: &str| 1e3 * phases.total(name).as_secs_f64() / (WARMUP + STEPS) as f64;
    println!(
        "  rein: {seconds:.3} s per step (reference {:.0} ms, forward + backward {:.0} ms, optimizer {:.0} ms), peak RSS {:.0} MiB",
        phase("reference"),
        phase("backward"),
        phase("optimizer"),
        rss.unwrap_or(f64::NAN)
    );

    let mut report = Report::default();
    let name = format!("DPO step, 3M Qwen2, {BATCH} pairs (s)");
    for checkpointing in [false, true] {
        let setting = match checkpointing {
            false => "TRL, no gradient checkpointing",
            true => "TRL's default: gradient checkpointing",
        };
        let (label, theirs, their_rss) = match trl_peer(dir, checkpointing) {
            Ok(measured) => measured,
            Err(reason) => {
                report.not_measured(name.clone(), setting, reason);
                continue;
            }
        };
        report.push(Row {
            name: name.clone(),
            value: seconds,
            unit: "s",
            baseline: Some((label.clone(), theirs)),
            target: (!checkpointing).then(|| (format!("≥ 2× TRL ({:.2}×)", theirs / seconds), 2.0 * seconds <= theirs)),
        });
        if let (Some(ours), Some(their_rss)) = (rss, their_rss) {
            report.push(Row {
                name: "DPO step, peak resident memory (MiB)".into(),
                value: ours,
                unit: "MiB",
                baseline: Some((label, their_rss)),
                target: Some(("≤ TRL's".into(), ours <= their_rss)),
            });
        }
    }
    Ok(report)
}

/// TRL's `DPOTrainer` on the same checkpoint and pairs: its label, seconds per step and peak
/// resident memory, or why it could not run.
fn trl_peer(dir: &Path, checkpointing: bool) -> Result<(String, f64, Option<f64>), String> {
    println!(
        "  TRL DPOTrainer on the same checkpoint and pairs (benches/peers/trl_dpo.py), gradient checkpointing {}",
        if checkpointing { "on" } else { "off" }
    );
    let mut args = vec![
        dir.display().to_string(),
        dir.join("pairs.jsonl").display().to_string(),
        format!("--warmup={WARMUP}"),
        format!("--steps={STEPS}"),
        format!("--batch={BATCH}"),
        format!("--lr={LR}"),
        format!("--output-dir={}", dir.join("trl").display()),
    ];
    if checkpointing {
        args.push("--gradient-checkpointing".into());
    }
    let what = if checkpointing {
        "TRL, gradient checkpointing"
    } else {
        "TRL"
    };
    crate::peers::trl_step("trl_dpo.py", args, what, checkpointing)
}

//! What a language-model run reports ([`LmOutcome`]) and writes about itself: evaluation
//! records in `metrics.jsonl`, the one-line summary of an evaluation, and `report.md`.

use rein_recipe::LoadedRecipe;
use serde_json::json;

use std::path::PathBuf;

use crate::LmError;
use crate::{EvalReport, OnlineOutcome};

/// What a language-model run reports.
#[derive(Debug, Clone, Default)]
pub struct LmOutcome {
    /// Held-out evaluation before RL (after SFT, when there is an SFT stage).
    pub before: Option<EvalReport>,
    /// Held-out evaluation after training.
    pub after: Option<EvalReport>,
    /// The GRPO stage's timings.
    pub grpo: Option<OnlineOutcome>,
    /// The DPO stage, when the recipe's algorithm is DPO.
    pub dpo: Option<DpoOutcome>,
    /// The KTO stage, when the recipe's algorithm is KTO.
    pub kto: Option<KtoOutcome>,
    /// Reward-model training, when that is the recipe's algorithm.
    pub reward_model: Option<RewardModelOutcome>,
    /// Process-reward-model training, when that is the recipe's algorithm.
    pub process_reward_model: Option<ProcessRewardModelOutcome>,
    /// Seconds spent in SFT.
    pub sft_seconds: f64,
    /// Seconds for the whole run.
    pub total_seconds: f64,
    /// The run directory.
    pub run_dir: Option<PathBuf>,
}

/// What the DPO stage reports.
#[derive(Debug, Clone, Default)]
pub struct DpoOutcome {
    /// Steps done.
    pub steps: usize,
    /// Seconds the stage took (resumed parts included).
    pub seconds: f64,
    /// Preference pairs trained on.
    pub pairs: usize,
    /// Rows skipped (each named on stderr when the run started).
    pub skipped: usize,
}

/// What the KTO stage reports.
#[derive(Debug, Clone, Default)]
pub struct KtoOutcome {
    /// Steps done.
    pub steps: usize,
    /// Seconds the stage took (resumed parts included).
    pub seconds: f64,
    /// Desirable completions trained on.
    pub desirable: usize,
    /// Undesirable completions trained on.
    pub undesirable: usize,
    /// Rows skipped (each named on stderr when the run started).
    pub skipped: usize,
}

/// What reward-model training reports.
#[derive(Debug, Clone, Default)]
pub struct RewardModelOutcome {
    /// Steps done.
    pub steps: usize,
    /// Seconds the training took (resumed parts included).
    pub seconds: f64,
    /// Preference pairs trained on.
    pub pairs: usize,
    /// Held-out pairs.
    pub test_pairs: usize,
    /// Rows skipped (each named on stderr when the run started).
    pub skipped: usize,
    /// Held-out pairwise accuracy of the fresh score head.
    pub accuracy_before: Option<f64>,
    /// And after training.
    pub accuracy_after: Option<f64>,
}

/// What process-reward-model training reports.
#[derive(Debug, Clone, Default)]
pub struct ProcessRewardModelOutcome {
    /// Steps done.
    pub steps: usize,
    /// Seconds the training took (resumed parts included).
    pub seconds: f64,
    /// Step-labelled rows trained on.
    pub rows: usize,
    /// Held-out rows.
    pub test_rows: usize,
    /// Rows skipped (each named on stderr when the run started).
    pub skipped: usize,
    /// Held-out step accuracy of the fresh head.
    pub accuracy_before: Option<f64>,
    /// And after training.
    pub accuracy_after: Option<f64>,
}

/// Appends the held-out evaluation `when` ("before" or "after") after `step` to the metrics.
pub(crate) fn log_eval(
    metrics: Option<&mut rein_run::MetricsWriter>,
    when: &str,
    step: usize,
    report: &EvalReport,
) -> Result<(), LmError> {
    if let Some(m) = metrics {
        let mut record = json!({
            "stage": "eval",
            "when": when,
            "step": step,
            "eval/greedy_accuracy": report.greedy_accuracy,
            "eval/pass_at_k": report.pass_at_k,
            "eval/maj_at_k": report.maj_at_k,
            "eval/k": report.k,
            "eval/examples": report.examples,
            "eval/turns": report.episodes.as_ref().map(|e| e.turns),
            "eval/tool_call_rate": report.episodes.as_ref().map(|e| e.tool_call_rate),
            "eval/tool_errors": report.episodes.as_ref().map(|e| e.tool_errors),
            "eval/truncated_frac": report.episodes.as_ref().map(|e| e.truncated),
        });
        for (source, accuracy) in &report.by_source {
            record[format!("eval/greedy_accuracy/{source}")] = json!(accuracy);
        }
        m.write(&record)?;
    }
    Ok(())
}

pub(crate) fn report_markdown(loaded: &LoadedRecipe, outcome: &LmOutcome) -> String {
    let mut text = format!(
        "# {}\n\nseed {}, {:.0} s in total",
        loaded.name(),
        loaded.recipe.seed,
        outcome.total_seconds
    );
    if outcome.sft_seconds > 0.0 {
        text.push_str(&format!(" (SFT {:.0} s)", outcome.sft_seconds));
    }
    text.push_str(&format!("\n\n{}", loaded.reproducibility()));
    if outcome.before.is_some() || outcome.after.is_some() {
        text.push_str("\n\n| held-out | greedy accuracy | pass@k | maj@k |\n|---|---|---|---|\n");
    }
    for (label, report) in [("before RL", &outcome.before), ("after RL", &outcome.after)] {
        if let Some(r) = report {
            let pct = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.1}%", 100.0 * v));
            text.push_str(&format!(
                "| {label} | {:.1}% | {} | {} |\n",
                100.0 * r.greedy_accuracy,
                pct(r.pass_at_k),
                pct(r.maj_at_k)
            ));
        }
    }
    if outcome
        .before
        .iter()
        .chain(&outcome.after)
        .any(|r| r.episodes.is_some())
    {
        text.push_str(
            "\n| greedy episodes | turns | tool-call rate | tool errors | truncated |\n|---|---|---|---|---|\n",
        );
        for (label, report) in [("before RL", &outcome.before), ("after RL", &outcome.after)] {
            if let Some(e) = report.as_ref().and_then(|r| r.episodes.as_ref()) {
                text.push_str(&format!(
                    "| {label} | {:.2} | {:.1}% | {} | {:.1}% |\n",
                    e.turns,
                    100.0 * e.tool_call_rate,
                    e.tool_errors,
                    100.0 * e.truncated
                ));
            }
        }
    }
    if let Some(r) = &outcome.reward_model {
        let pct = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.1}%", 100.0 * v));
        text.push_str(&format!(
            "\n| reward model | held-out pairwise accuracy |\n|---|---|\n| before training | {} |\n| after training | {} |\n",
            pct(r.accuracy_before),
            pct(r.accuracy_after)
        ));
        text.push_str(&format!(
            "\nReward model: {} steps in {:.1} s on {} preference pairs, {} held out ({} rows skipped)\n",
            r.steps, r.seconds, r.pairs, r.test_pairs, r.skipped
        ));
    }
    if let Some(r) = &outcome.process_reward_model {
        let pct = |x: Option<f64>| x.map_or("-".into(), |v| format!("{:.1}%", 100.0 * v));
        text.push_str(&format!(
            "\n| process reward model | held-out step accuracy |\n|---|---|\n| before training | {} |\n| after training | {} |\n",
            pct(r.accuracy_before),
            pct(r.accuracy_after)
        ));
        text.push_str(&format!(
            "\nProcess reward model: {} steps in {:.1} s on {} step-labelled rows, {} held out ({} rows skipped)\n",
            r.steps, r.seconds, r.rows, r.test_rows, r.skipped
        ));
    }
    if let Some(d) = &outcome.dpo {
        text.push_str(&format!(
            "\nDPO: {} steps in {:.1} s on {} preference pairs ({} rows skipped)\n",
            d.steps, d.seconds, d.pairs, d.skipped
        ));
    }
    if let Some(k) = &outcome.kto {
        text.push_str(&format!(
            "\nKTO: {} steps in {:.1} s on {} desirable and {} undesirable completions ({} rows skipped)\n",
            k.steps, k.seconds, k.desirable, k.undesirable, k.skipped
        ));
    }
    if let Some(g) = &outcome.grpo {
        text.push_str(&format!(
            "\n{}: {} steps; generate {:.1} s, reward {:.1} s, train {:.1} s; final mean reward {:.3}\n",
            g.algorithm,
            g.steps,
            g.generate.as_secs_f64(),
            g.reward.as_secs_f64(),
            g.train.as_secs_f64(),
            g.final_reward
        ));
    }
    text.push_str(&examples_markdown(outcome));
    text
}

/// The first held-out prompts with the greedy completions before and after RL.
fn examples_markdown(outcome: &LmOutcome) -> String {
    let shown = |report: &Option<EvalReport>| report.as_ref().map(|r| r.shown.clone()).unwrap_or_default();
    let (before, after) = (shown(&outcome.before), shown(&outcome.after));
    let count = before.len().max(after.len());
    if count == 0 {
        return String::new();
    }
    let mut text = format!("\n## Examples: the first {count} held-out prompts, greedy\n");
    let quote = |completion: &str| {
        let lines: Vec<String> = completion.lines().map(|l| format!("> {l}")).collect();
        match lines.is_empty() {
            true => "> (empty)".to_string(),
            false => lines.join("\n"),
        }
    };
    for i in 0..count {
        let example = before.get(i).or(after.get(i)).expect("i < count");
        text.push_str(&format!("\n### {}\n\n{}\n", i + 1, quote(&example.prompt)));
        if let Some(reference) = &example.reference {
            text.push_str(&format!("\nreference: `{reference}`\n"));
        }
        for (label, list) in [("before RL", &before), ("after RL", &after)] {
            if let Some(e) = list.get(i) {
                let verdict = if e.correct { "correct" } else { "wrong" };
                text.push_str(&format!("\n{label} ({verdict}):\n\n{}\n", quote(&e.completion)));
            }
        }
    }
    text
}

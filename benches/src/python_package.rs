//! `cargo xtask bench plugins`, the Python package's rows: `math-answer` through
//! `rein_sandbox.trl.reward_fn` against the same check as a plain Python function (TRL's way) and
//! against math-verify, on the same completions; and TRL's `GRPOTrainer` run with the sandboxed
//! reward against the same run with the plain Python one (benches/peers/sandbox_reward.py,
//! trl_grpo.py). `cargo xtask bench` installs the wheel and math-verify and names their folders
//! in `REIN_SANDBOX_PYTHONPATH` and `REIN_MATH_VERIFY_PYTHONPATH`.

use std::path::{Path, PathBuf};

use rein_model::CpuAutodiff;
use rein_model::lm::{LmTokenizer, save};

use crate::peers::{self, Python};
use crate::qwen2_3m::qwen2_3m;
use crate::report::{Report, Row};

/// Completions/s through the adapter, beside the plain Python function's (`plain`, measured
/// on the same `groups_file`) and math-verify's.
pub fn adapter_rows(groups_file: &Path, plain: &Result<(String, f64), String>, report: &mut Report) {
    let name = "math-answer via rein_sandbox.trl.reward_fn (Python), same completions";
    let Some(sandbox) = std::env::var_os("REIN_SANDBOX_PYTHONPATH") else {
        report.not_measured(
            name,
            "rein_sandbox",
            "REIN_SANDBOX_PYTHONPATH is unset (run `cargo xtask bench plugins`)",
        );
        return;
    };
    let mut args = vec![groups_file.as_os_str().to_owned(), "--sandbox-path".into(), sandbox];
    if let Some(math_verify) = std::env::var_os("REIN_MATH_VERIFY_PYTHONPATH") {
        args.extend(["--math-verify-path".into(), math_verify]);
    }
    let value = match peers::run_with(Python::System, "sandbox_reward.py", args) {
        Ok(value) => value,
        Err(reason) => return report.not_measured(name, "sandbox_reward.py", reason),
    };
    peers::describe("sandbox_reward.py", &value);
    let Some(adapter) = value["adapter_completions_per_s"].as_f64() else {
        return report.not_measured(name, "sandbox_reward.py", "no `adapter_completions_per_s`");
    };
    match plain {
        Ok((label, rate)) => report.push(Row {
            name: name.into(),
            value: adapter,
            unit: "completions/s",
            baseline: Some((label.clone(), *rate)),
            target: None,
        }),
        Err(reason) => report.not_measured(name, "plain Python function (python_reward.py)", reason.clone()),
    }
    let row = "  vs math-verify (parse + verify per completion)";
    match value["math_verify_completions_per_s"].as_f64() {
        Some(rate) => {
            println!(
                "  math-verify agrees with math-answer on {:.1}% of the completions",
                100.0 * value["math_verify_agreement"].as_f64().unwrap_or(f64::NAN)
            );
            report.push(Row {
                name: row.into(),
                value: adapter,
                unit: "completions/s",
                baseline: Some((format!("math-verify ({})", peers::versions(&value)), rate)),
                target: None,
            });
        }
        None => report.not_measured(row, "math-verify", "REIN_MATH_VERIFY_PYTHONPATH is unset"),
    }
}

/// TRL's `GRPOTrainer` on a random 3M-parameter Qwen2 with the sandboxed reward, seconds per
/// step beside the same run with the plain Python reward (`.venv`'s TRL).
pub fn trl_grpo_rows(report: &mut Report) -> anyhow::Result<()> {
    let name = "TRL GRPOTrainer step with rein_sandbox's reward (random Qwen2 3M)";
    let Some(sandbox) = std::env::var_os("REIN_SANDBOX_PYTHONPATH") else {
        report.not_measured(name, "rein_sandbox", "REIN_SANDBOX_PYTHONPATH is unset");
        return Ok(());
    };
    let dir = PathBuf::from("target/bench/trl-rein-reward");
    let model = qwen2_3m::<CpuAutodiff>(&Default::default())?;
    let tokenizer = LmTokenizer::load(Path::new("recipes/assets/arithmetic-tokenizer"), &[])?;
    save(&model, &dir)?;
    tokenizer.save(&dir)?;
    let mut lines = String::new();
    for prompt in crate::grpo::arithmetic_prompts(&tokenizer, None)?.iter().take(8 * 4) {
        let row = serde_json::json!({
            "prompt": tokenizer.decode(&prompt.tokens, false)?,
            "answer": prompt.answer.clone().unwrap_or_default(),
        });
        lines += &format!("{row}\n");
    }
    std::fs::write(dir.join("prompts.jsonl"), lines)?;
    let run = |rein: bool| -> Result<(String, f64, Vec<f64>), String> {
        let mut args: Vec<String> = vec![
            dir.display().to_string(),
            dir.join("prompts.jsonl").display().to_string(),
            "--warmup=1".into(),
            "--steps=3".into(),
            format!("--output-dir={}", dir.join("trl").display()),
        ];
        if rein {
            args.push(format!("--rein-reward={}", Path::new(&sandbox).display()));
        }
        let value = peers::run("trl_grpo.py", args)?;
        peers::describe("trl_grpo.py", &value);
        let seconds = value["seconds_per_step"].as_f64().ok_or("no `seconds_per_step`")?;
        let means = value["reward_means"]
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_f64()).collect())
            .unwrap_or_default();
        Ok((peers::versions(&value), seconds, means))
    };
    match (run(true), run(false)) {
        (Ok((versions, rein, rein_means)), Ok((_, plain, plain_means))) => {
            println!("  mean reward per step: rein_sandbox {rein_means:?}, plain Python {plain_means:?}");
            report.push(Row {
                name: name.into(),
                value: rein,
                unit: "s/step",
                baseline: Some((format!("the plain Python reward ({versions})"), plain)),
                target: None,
            });
        }
        (Err(reason), _) | (_, Err(reason)) => report.not_measured(name, "TRL (trl_grpo.py)", reason),
    }
    Ok(())
}

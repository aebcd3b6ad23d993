//! `rein-plot`: charts and summary.md from a run directory's metrics.jsonl, and its errors.

use std::path::{Path, PathBuf};

use rein_plot::{PlotError, plot_run, read_metrics};

fn run_dir(tag: &str, metrics: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("plots-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("metrics.jsonl"), metrics).unwrap();
    dir
}

/// Lines shaped like an LM run's: SFT steps, GRPO steps with nulls, eval before and after.
const LM_METRICS: &str = r#"{"stage":"sft","step":1,"sft/loss":6.3,"sft/lr":0.0001,"time/elapsed_s":0.4}
{"stage":"sft","step":2,"sft/loss":5.9,"sft/lr":0.0002,"time/elapsed_s":0.8}
{"eval/greedy_accuracy":0.52,"stage":"eval","step":0,"when":"before"}
{"stage":"grpo","step":1,"train/reward":0.5,"train/kl":null,"train/reward/math-answer/correct":0.3,"time/generate_s":0.1}
{"stage":"grpo","step":2,"train/reward":0.6,"train/kl":null,"train/reward/math-answer/correct":0.45,"time/generate_s":0.1}
{"stage":"grpo","step":3,"train/reward":0.7,"train/kl":0.01,"train/reward/math-answer/correct":0.5,"time/generate_s":0.12}
{"eval/greedy_accuracy":0.68,"stage":"eval","step":3,"when":"after"}
"#;

#[test]
fn a_run_gets_png_and_svg_charts_and_a_summary() {
    let dir = run_dir("lm", LM_METRICS);
    let written = plot_run(&dir).expect("plots");
    let names: Vec<String> = written
        .iter()
        .map(|p| p.strip_prefix(&dir).unwrap().display().to_string())
        .collect();
    for figure in ["sft", "eval", "grpo-train", "grpo-time"] {
        assert!(
            names.contains(&format!("plots/{figure}.png")),
            "{figure}.png in {names:?}"
        );
        assert!(
            names.contains(&format!("plots/{figure}.svg")),
            "{figure}.svg in {names:?}"
        );
    }
    let png = std::fs::read(dir.join("plots/grpo-train.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let svg = std::fs::read_to_string(dir.join("plots/grpo-train.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("train/reward/math-answer/correct"));

    let summary = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    assert!(summary.contains("![grpo-train](plots/grpo-train.png)"), "{summary}");
    // first, last, lowest, highest; `null` is a gap, not a zero
    assert!(
        summary.contains("| `train/reward` | 3 | 0.5000 | 0.7000 | 0.5000 | 0.7000 |"),
        "{summary}"
    );
    assert!(
        summary.contains("| `train/kl` | 1 | 0.01000 | 0.01000 | 0.01000 | 0.01000 |"),
        "{summary}"
    );
    assert!(
        summary.contains("| `eval/greedy_accuracy` | 2 | 0.5200 | 0.6800 |"),
        "{summary}"
    );
}

#[test]
fn ppo_metrics_are_plotted_against_environment_steps() {
    let metrics = r#"{"update":1,"global_step":256,"charts/episodic_return":null,"losses/value_loss":6.4}
{"update":2,"global_step":512,"charts/episodic_return":21.5,"losses/value_loss":5.1}
"#;
    let figures = read_metrics(&run_dir("ppo", metrics).join("metrics.jsonl")).unwrap();
    let names: Vec<&str> = figures.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["charts", "losses"]);
    let value_loss = &figures[1].series[0];
    assert_eq!(value_loss.x_label, "global_step");
    assert_eq!(value_loss.points, [(256.0, 6.4), (512.0, 5.1)]);
}

#[test]
fn bad_metrics_are_reported_with_file_and_line() {
    let dir = run_dir("malformed", "{\"step\":1,\"loss\":1.0}\n{\"step\":2,\"loss\":\n");
    let err = plot_run(&dir).unwrap_err();
    assert!(matches!(err, PlotError::Malformed { line: 2, .. }), "{err}");
    assert!(err.to_string().contains("metrics.jsonl:2"), "{err}");

    let dir = run_dir("array", "[1, 2]\n");
    let err = plot_run(&dir).unwrap_err();
    assert!(err.to_string().contains("found an array"), "{err}");

    let dir = run_dir("empty", "{\"stage\":\"sft\",\"step\":1}\n");
    assert!(matches!(plot_run(&dir).unwrap_err(), PlotError::Empty { .. }));

    let missing = Path::new(env!("CARGO_TARGET_TMPDIR")).join("no-such-run");
    let err = plot_run(&missing).unwrap_err();
    assert!(
        matches!(err, PlotError::Read { .. }) && err.to_string().contains("no-such-run"),
        "{err}"
    );
}

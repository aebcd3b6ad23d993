//! The CPU half of every parity row: the rows `run.sh` checks on a GPU hold on the CPU backend,
//! from the same fixtures, so a failure on the GPU is the GPU path's.

use std::path::Path;
use std::process::Command;

/// Every parity row on the CPU, with rein's kernels or (`generic_ops`) with burn's generic ops,
/// the path a CUDA run takes.
fn every_parity_row_holds(generic_ops: bool) {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("gpu-check-cpu-{generic_ops}.json"));
    let _ = std::fs::remove_file(&out);
    let run = Command::new(env!("CARGO_BIN_EXE_rein-gpu-check"))
        .args(generic_ops.then_some("--generic-ops"))
        .args(["--device", "cpu", "--fixtures"])
        .arg(&fixtures)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let results: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let parity: Vec<&serde_json::Value> = results["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "parity")
        .collect();
    // Four logit rows (f32 and bf16, unfused and fused) and one greedy row per checkpoint, three rows for the GRPO step against
    // PyTorch, three for the step with KL and LoRA and two for a multi-turn session against
    // the CPU kernels, one each for SFT and GRPO split across two peers against unsplit.
    assert_eq!(parity.len(), 4 * 5 + 3 + 3 + 2 + 2, "{stdout}");
    assert!(parity.iter().all(|r| r["ok"] == true), "{stdout}");
    assert!(stdout.contains("0 failed"), "{stdout}");
}

#[test]
fn every_parity_row_holds_on_the_cpu() {
    every_parity_row_holds(false);
}

/// The CUDA path's ops on the CPU: and the step with KL and LoRA then compares them with rein's
/// CPU kernels, not with themselves.
#[test]
fn every_parity_row_holds_on_the_cpu_with_the_generic_ops() {
    every_parity_row_holds(true);
}

#[test]
fn without_cuda_compiled_in_the_cuda_device_is_refused_by_name() {
    if cfg!(feature = "cuda") {
        return;
    }
    for args in [&["--device", "cuda"][..], &["--cublas"]] {
        let run = Command::new(env!("CARGO_BIN_EXE_rein-gpu-check"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(run.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&run.stderr).contains("--features cuda"),
            "{args:?}"
        );
    }
}

/// The speed rows run on the CPU too (their figures are not checked, only that each row chosen
/// is there and no other): generation with bf16 products, and the GRPO step and its three
/// phases, in f32 and in mixed precision, with completions of their own length, on a tiny
/// checkpoint.
#[test]
fn the_chosen_speed_rows_run_and_no_others() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let (prompts, out) = (dir.join("gpu-check-prompts.json"), dir.join("gpu-check-speed.json"));
    std::fs::write(&prompts, "[[5, 6, 7, 8], [9, 10, 11, 12]]").unwrap();
    let _ = std::fs::remove_file(&out);
    let run = Command::new(env!("CARGO_BIN_EXE_rein-gpu-check"))
        .args([
            "--device",
            "cpu",
            "--no-parity",
            "--speed-rows",
            "generation-bf16,step,step-bf16",
            "--step-rows",
            "2",
            "--step-tokens",
            "5",
            "--batches",
            "2",
        ])
        .args(["--new-tokens", "3", "--speed-model"])
        .arg(fixtures.join("lm/qwen2-gqa"))
        .arg("--prompts")
        .arg(&prompts)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let results: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let speed: Vec<&str> = results["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == "speed")
        .map(|r| r["check"].as_str().unwrap())
        .collect();
    let steps = ["f32", "bf16 mixed"].iter().flat_map(|dtype| {
        let step = format!("rein grpo step {dtype}, 2 rows × 4+5");
        std::iter::once(step.clone())
            .chain(["forward and loss", "backward", "clip and AdamW"].map(|phase| format!("{step}: {phase}")))
    });
    let expected: Vec<String> = std::iter::once("rein generate bf16, batch 2".to_string())
        .chain(steps)
        .collect();
    assert_eq!(speed, expected, "{stdout}");
    // What a launch profile is divided by: 4 warm-up passes, then 2 + 3 at batch 2; 7 rounds
    // of each step.
    let counts: Vec<(&str, &str)> = results["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["check"].as_str().unwrap().ends_with(" run"))
        .map(|r| (r["check"].as_str().unwrap(), r["detail"].as_str().unwrap()))
        .collect();
    assert_eq!(
        counts,
        [
            ("generate bf16: forward passes run", "9"),
            ("rein grpo step f32, 2 rows × 4+5: steps run", "7"),
            ("rein grpo step bf16 mixed, 2 rows × 4+5: steps run", "7"),
        ],
        "{stdout}"
    );
}

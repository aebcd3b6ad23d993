//! Results the host must refuse, and output it must cap.

use rein_core::{OutputError, PluginErrorKind, RewardFn};
use rein_plugin::SandboxLimits;

use super::{attack, attack_fails, hostile, quick_limits, scores_good_batch};

#[test]
fn nan_and_infinite_scores_are_rejected() {
    let mut reward = hostile(quick_limits());
    for name in ["nan", "infinity", "nan-component"] {
        let error = attack_fails(&mut reward, name);
        assert!(
            matches!(
                error.kind,
                PluginErrorKind::InvalidOutput(OutputError::NonFinite { .. })
            ),
            "{name}: {error}"
        );
        assert!(!error.is_trap(), "a bad value is not a trap: the instance is kept");
        scores_good_batch(&mut reward);
    }
}

/// Step scores outside their completion, overlapping, or not finite are refused, naming the
/// step; the instance is kept.
#[test]
fn bad_step_scores_are_rejected_naming_the_step() {
    let mut reward = hostile(quick_limits());
    for (name, expected) in [
        (
            "step-past-the-end",
            "step 0 of group 0, completion 0: spans characters 0..2 of a completion of 1 characters",
        ),
        (
            "overlapping-steps",
            "step 1 of group 0, completion 0: overlaps step 0 (characters 0..1)",
        ),
        ("nan-step", "step 0 of group 0, completion 0: its score is NaN"),
    ] {
        let error = attack_fails(&mut reward, name);
        assert!(
            matches!(error.kind, PluginErrorKind::InvalidOutput(OutputError::BadStep { .. })),
            "{name}: {error}"
        );
        assert!(error.to_string().contains(expected), "{name}: {error}");
        assert!(!error.is_trap());
        scores_good_batch(&mut reward);
    }
}

#[test]
fn wrong_length_results_are_rejected() {
    let mut reward = hostile(quick_limits());
    let error = attack_fails(&mut reward, "wrong-length");
    let expected = OutputError::WrongLength {
        what: "scores in group 0".into(),
        expected: 2,
        got: 3,
    };
    assert_eq!(error.kind, PluginErrorKind::InvalidOutput(expected));
    scores_good_batch(&mut reward);
}

#[test]
fn oversized_output_is_refused() {
    // Writing 80 MiB takes a while on a loaded machine: the deadline is not what is tested.
    let mut reward = hostile(SandboxLimits {
        memory_mib: 256,
        timeout_ms: 10_000,
        ..quick_limits()
    });
    let error = attack_fails(&mut reward, "oversized-output");
    let PluginErrorKind::InvalidOutput(OutputError::TooLarge { limit, bytes, .. }) = error.kind else {
        panic!("expected TooLarge, got {error}")
    };
    assert_eq!(limit, 64 << 20);
    assert!(bytes > limit);
    scores_good_batch(&mut reward);
}

#[test]
fn flooding_stdout_is_capped_not_fatal() {
    // A generous deadline: this tests the output cap, not time (100k lines took over 200 ms on
    // a loaded machine).
    let mut reward = hostile(SandboxLimits {
        timeout_ms: 10_000,
        ..quick_limits()
    });
    let scores = reward.score(&attack("flood-stdout")).expect("printing is allowed");
    assert_eq!(
        scores[0].iter().map(|s| s.score).collect::<Vec<_>>(),
        vec![Some(1.0), Some(0.0)]
    );
    let stdout = reward.stdout();
    assert!(stdout.len() < 70 << 10, "kept {} bytes", stdout.len());
    assert!(
        stdout.starts_with('[') && stdout.contains("earlier bytes dropped"),
        "{}",
        &stdout[..80]
    );
    assert!(stdout.ends_with("line 99999 of a chatty plugin"));
}

#[test]
fn a_plugin_error_keeps_the_instance() {
    let mut reward = hostile(quick_limits());
    let error = attack_fails(&mut reward, "guest-error");
    assert_eq!(
        error.kind,
        PluginErrorKind::Guest {
            message: "group 0: refusing on purpose".into()
        }
    );
    assert!(!error.is_trap());
    scores_good_batch(&mut reward);
}

#[test]
fn attacks_in_a_row_never_poison_the_host() {
    let mut reward = hostile(quick_limits());
    for name in [
        "panic",
        "nan",
        "memory-bomb",
        "wrong-length",
        "deep-recursion",
        "guest-error",
        "panic",
    ] {
        attack_fails(&mut reward, name);
        scores_good_batch(&mut reward);
    }
}

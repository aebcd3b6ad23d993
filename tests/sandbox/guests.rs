//! Python and JavaScript plugins (componentize-py, componentize-js) in the same sandbox: the
//! same limits stop `hostile-reward-py` and `hostile-reward-js` with the same typed errors as
//! the Rust `hostile-reward`, and the same host then scores a good batch.

use std::sync::LazyLock;

use rein_core::{OutputError, PluginErrorKind};
use rein_plugin::{Plugin, RewardPlugin, SandboxLimits};

use super::{QUICK_TIMEOUT, attack_fails, common, quick_limits, scores_good_batch};

const GUESTS: [&str; 2] = ["hostile-reward-py", "hostile-reward-js"];

/// Each guest loaded once under [`quick_limits`] (compiling an interpreter takes seconds).
fn guest(name: &str) -> RewardPlugin {
    static LOADED: LazyLock<Vec<Plugin>> = LazyLock::new(|| {
        GUESTS
            .iter()
            .map(|name| common::load_with(&common::test_plugin_path(name), quick_limits()))
            .collect()
    });
    let index = GUESTS.iter().position(|g| *g == name).expect("a guest plugin");
    LOADED[index]
        .reward("{}")
        .expect("the hostile guests accept an empty config")
}

#[test]
fn infinite_loops_hit_the_deadline() {
    for name in GUESTS {
        let mut reward = guest(name);
        let error = attack_fails(&mut reward, "infinite-loop");
        assert_eq!(error.kind, PluginErrorKind::Timeout { limit: QUICK_TIMEOUT }, "{name}");
        scores_good_batch(&mut reward);
    }
}

#[test]
fn memory_bombs_hit_the_memory_limit() {
    for name in GUESTS {
        let mut reward = guest(name);
        let error = attack_fails(&mut reward, "memory-bomb");
        assert_eq!(
            error.kind,
            PluginErrorKind::MemoryLimit { limit_bytes: 64 << 20 },
            "{name}"
        );
        scores_good_batch(&mut reward);
    }
}

#[test]
fn fuel_budgets_stop_interpreted_loops() {
    let limits = SandboxLimits {
        fuel: Some(200_000_000),
        timeout_ms: 60_000,
        ..quick_limits()
    };
    for name in GUESTS {
        let plugin = common::load_with(&common::test_plugin_path(name), limits.clone());
        let mut reward = plugin.reward("{}").unwrap();
        let error = attack_fails(&mut reward, "infinite-loop");
        assert_eq!(error.kind, PluginErrorKind::OutOfFuel { limit: 200_000_000 }, "{name}");
        scores_good_batch(&mut reward);
    }
}

#[test]
fn non_finite_and_wrong_length_results_are_rejected() {
    for name in GUESTS {
        let mut reward = guest(name);
        let error = attack_fails(&mut reward, "nan");
        assert!(
            matches!(
                error.kind,
                PluginErrorKind::InvalidOutput(OutputError::NonFinite { .. })
            ),
            "{name}: {error}"
        );
        let error = attack_fails(&mut reward, "wrong-length");
        let expected = OutputError::WrongLength {
            what: "scores in group 0".into(),
            expected: 2,
            got: 3,
        };
        assert_eq!(error.kind, PluginErrorKind::InvalidOutput(expected), "{name}");
        scores_good_batch(&mut reward);
    }
}

#[test]
fn plugin_errors_keep_the_instance_and_uncaught_exceptions_trap_with_the_traceback() {
    for name in GUESTS {
        let mut reward = guest(name);
        let error = attack_fails(&mut reward, "guest-error");
        assert_eq!(
            error.kind,
            PluginErrorKind::Guest {
                message: "group 0: refusing on purpose".into()
            },
            "{name}"
        );
        // A Python exception that is not `Err(PluginError)`, or a JS throw of a non-Error,
        // aborts the guest; what it printed is kept for the message.
        let error = attack_fails(&mut reward, "raise");
        let PluginErrorKind::Trap { stderr, .. } = &error.kind else {
            panic!("{name}: expected a trap, got {error}")
        };
        assert!(!stderr.is_empty(), "{name}: the guest's stderr is lost");
        scores_good_batch(&mut reward);
    }
}

//! Components the host must refuse to load, each with its typed error.

use rein_core::{Group, PluginErrorKind, RewardFn, TextEnv, Tool};
use rein_plugin::{PluginKind, SandboxLimits};

use super::{hostile, quick_limits, scores_good_batch};
use crate::common::{plugin_path, runtime, test_plugin_path};

#[test]
fn an_unknown_import_is_named() {
    let error = runtime()
        .load(test_plugin_path("imports-unknown"), SandboxLimits::default())
        .unwrap_err();
    assert_eq!(
        error.kind,
        PluginErrorKind::MissingImport {
            import: "test:spy/exfiltrate".into()
        }
    );
    assert_eq!(error.plugin, "imports-unknown");
    scores_good_batch(&mut hostile(quick_limits()));
}

#[test]
fn another_interface_version_is_named() {
    let error = runtime()
        .load(test_plugin_path("reward-v0-1"), SandboxLimits::default())
        .unwrap_err();
    assert_eq!(
        error.kind,
        PluginErrorKind::InterfaceVersion {
            expected: "0.5.0".into(),
            found: "rein:plugin/reward-api@0.1.0".into()
        }
    );
    scores_good_batch(&mut hostile(quick_limits()));
}

/// Components built against 0.3.0, before step scores, load and run as they did: a reward
/// through the frozen 0.3.0 bindings (its scores have no steps), a tool through the frozen
/// 0.4.0 bindings after its interfaces are renamed to the versions defining them the same.
#[test]
fn components_of_the_previous_interface_still_load_and_run() {
    let plugin = runtime()
        .load(test_plugin_path("reward-v0-3"), SandboxLimits::default())
        .unwrap();
    assert_eq!(
        (plugin.kind(), plugin.info().interface_version.as_str()),
        (PluginKind::Reward, "0.3.0")
    );
    assert!(!plugin.info().reads_tokens);
    let mut reward = plugin.reward("{}").unwrap();
    let groups = [Group {
        prompt: "p".into(),
        completions: vec!["is 42".into(), "is 41".into()],
        reference: Some("42".into()),
        ..Group::default()
    }];
    let scores = reward.score(&groups).unwrap();
    let values: Vec<_> = scores[0]
        .iter()
        .map(|s| (s.score, s.components.clone(), s.steps.len()))
        .collect();
    assert_eq!(
        values,
        [
            (Some(1.0), vec![("length".to_string(), 5.0)], 0),
            (Some(0.0), vec![("length".to_string(), 5.0)], 0)
        ]
    );
    let refused = plugin.reward(r#"{"x": 1}"#).unwrap_err();
    assert!(refused.to_string().contains("takes no config"), "{refused}");

    let plugin = runtime()
        .load(test_plugin_path("tool-v0-3"), SandboxLimits::default())
        .unwrap();
    assert_eq!(
        (plugin.kind(), plugin.info().interface_version.as_str()),
        (PluginKind::Tool, "0.3.0")
    );
    let mut tool = plugin.tool("{}").unwrap();
    assert_eq!(tool.spec().name, "reverse");
    assert_eq!(tool.call(r#"{"text":"abc"}"#).unwrap(), "cba".into());
    assert!(tool.call("{}").unwrap_err().message.contains("expected"));
}

/// Components built against 0.4.0, before images, load and run as they did through the frozen
/// 0.4.0 bindings: a reward still receives tokens and returns step scores, a tool's text and a
/// text environment's replies come back without images.
#[test]
fn components_of_0_4_0_still_load_and_run() {
    let load = |name| {
        runtime()
            .load(test_plugin_path(name), SandboxLimits::default())
            .unwrap()
    };
    let plugin = load("reward-v0-4");
    assert_eq!(
        (plugin.kind(), plugin.info().interface_version.as_str()),
        (PluginKind::Reward, "0.4.0")
    );
    assert!(plugin.info().reads_tokens && !plugin.info().reads_images);
    let token = |text: &str| rein_core::Token {
        text: text.into(),
        logprob: -0.5,
    };
    let groups = [Group {
        prompt: "p".into(),
        completions: vec!["ab".into(), "c".into()],
        tokens: vec![vec![token("a"), token("b")], vec![token("c")]],
        ..Group::default()
    }];
    let scores = plugin.reward("{}").unwrap().score(&groups).unwrap();
    let values: Vec<_> = scores[0]
        .iter()
        .map(|s| {
            (
                s.score,
                s.steps.iter().map(|s| (s.start, s.end, s.score)).collect::<Vec<_>>(),
            )
        })
        .collect();
    assert_eq!(values, [(Some(2.0), vec![(0, 1, 1.0)]), (Some(1.0), vec![(0, 1, 1.0)])]);

    let plugin = load("tool-v0-4");
    assert_eq!(plugin.info().interface_version, "0.4.0");
    let mut tool = plugin.tool("{}").unwrap();
    assert_eq!(tool.call(r#"{"text":"abc"}"#).unwrap(), "cba".into());

    let plugin = load("text-env-v0-4");
    assert_eq!(
        (plugin.kind(), plugin.info().interface_version.as_str()),
        (PluginKind::TextEnv, "0.4.0")
    );
    let mut env = plugin.text_env("{}").unwrap();
    let start = rein_core::EpisodeStart {
        id: 7,
        prompt: "Say something.".into(),
        ..Default::default()
    };
    let opening = env.reset(&[start]).unwrap().remove(0);
    assert_eq!(
        (opening.messages[0].content.as_str(), opening.images.len()),
        ("Say something.", 0)
    );
    let turn = |content: &str| rein_core::Turn {
        id: 7,
        content: content.into(),
    };
    let reply = env.step(&[turn("hi")]).unwrap().remove(0);
    assert_eq!((reply.messages[0].content.as_str(), reply.done), ("HI", false));
    let reply = env.step(&[turn("bye")]).unwrap().remove(0);
    assert_eq!((reply.reward, reply.done), (Some(1.0), true));
}

#[test]
fn random_bytes_are_not_a_component() {
    let mut state = 0x2545_F491_4F6C_DD1D_u64;
    let bytes: Vec<u8> = (0..4096)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    let error = runtime()
        .load_bytes("random", &bytes, SandboxLimits::default())
        .unwrap_err();
    assert!(
        matches!(error.kind, PluginErrorKind::InvalidComponent { .. }),
        "{error}"
    );
    // A valid wasm header followed by garbage, and an empty file, fail the same way.
    let mut header = b"\0asm\x0d\0\x01\0".to_vec();
    header.extend_from_slice(&bytes[..64]);
    for bad in [header, Vec::new()] {
        let error = runtime()
            .load_bytes("random", &bad, SandboxLimits::default())
            .unwrap_err();
        assert!(
            matches!(error.kind, PluginErrorKind::InvalidComponent { .. }),
            "{error}"
        );
    }
    scores_good_batch(&mut hostile(quick_limits()));
}

#[test]
fn a_module_over_the_size_cap_is_refused_before_compiling() {
    let limits = SandboxLimits {
        max_module_mib: 1,
        ..SandboxLimits::default()
    };
    let big = vec![0u8; (1 << 20) + 1];
    let error = runtime().load_bytes("big", &big, limits).unwrap_err();
    assert_eq!(
        error.kind,
        PluginErrorKind::ModuleTooLarge {
            size: (1 << 20) + 1,
            limit: 1 << 20
        }
    );
}

#[test]
fn a_missing_file_is_named() {
    let error = runtime()
        .load("/nonexistent/plugin.wasm", SandboxLimits::default())
        .unwrap_err();
    let PluginErrorKind::Io { path, .. } = &error.kind else {
        panic!("{error}")
    };
    assert_eq!(path, "/nonexistent/plugin.wasm");
}

#[test]
fn the_wrong_kind_is_refused() {
    let cartpole = runtime()
        .load(plugin_path("cartpole"), SandboxLimits::default())
        .unwrap();
    assert_eq!(cartpole.kind(), PluginKind::Environment);
    let error = cartpole.reward("{}").unwrap_err();
    assert_eq!(
        error.kind,
        PluginErrorKind::WrongKind {
            expected: "reward",
            found: "environment"
        }
    );
    let math = runtime()
        .load(plugin_path("math-answer"), SandboxLimits::default())
        .unwrap();
    assert!(matches!(
        math.environment("{}").unwrap_err().kind,
        PluginErrorKind::WrongKind { .. }
    ));
}

#[test]
fn a_rejected_config_is_the_plugins_own_error() {
    let math = runtime()
        .load(plugin_path("math-answer"), SandboxLimits::default())
        .unwrap();
    let error = math.reward(r#"{"extrakt": "boxed"}"#).unwrap_err();
    let PluginErrorKind::Guest { message } = &error.kind else {
        panic!("{error}")
    };
    assert!(message.contains("unknown config key `extrakt`"), "{message}");
    assert_eq!(error.call, Some("init"));
}

#[test]
fn loading_twice_uses_the_artifact_cache() {
    let path = plugin_path("format-tags");
    let first = runtime().load(&path, SandboxLimits::default()).unwrap();
    let cache = runtime().cache().expect("the test runtime caches").dir().to_path_buf();
    let entries = std::fs::read_dir(&cache).unwrap().count();
    let second = runtime().load(&path, SandboxLimits::default()).unwrap();
    assert_eq!(first.info(), second.info());
    assert_eq!(
        std::fs::read_dir(&cache).unwrap().count(),
        entries,
        "no new artifact for the same bytes and engine"
    );
}

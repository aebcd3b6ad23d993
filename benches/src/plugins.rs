//! `cargo xtask bench plugins`: plugin call overhead and throughput against the same logic
//! run natively, and against Gymnasium when a Python venv with it is available.

use std::path::Path;
use std::time::{Duration, Instant};

use cartpole::CartPole;
use math_answer::MathAnswer;
use rein_core::{Action, BatchActions, Environment, Group, RewardFn, VecEnv};
use rein_pdk::{Config, Environment as _, Reward as _, Transition};
use rein_plugin::{ArtifactCache, PluginRuntime, SandboxLimits};

use crate::peers::Python;
use crate::report::{Report, Row, rate};

const BUDGET: Duration = Duration::from_millis(1500);

pub fn run(plugin_dir: &Path) -> anyhow::Result<Report> {
    let cache = std::env::temp_dir().join(format!("rein-bench-cache-{}", std::process::id()));
    let runtime = PluginRuntime::new(Some(ArtifactCache::new(&cache)));
    let mut report = Report::default();
    let peers = gymnasium_peers();

    let cartpole = runtime.load(plugin_dir.join("cartpole.wasm"), SandboxLimits::default())?;
    // Batched stepping, 256 envs.
    let n = 256;
    let mut batch = cartpole.vec_env("{}", n)?;
    batch.reset(0)?;
    let actions = BatchActions::Discrete((0..n as u32).map(|i| (i * 7 + i / 3) % 2).collect());
    let plugin_rate = rate(BUDGET, n as f64, || {
        batch.step(&actions).expect("cartpole steps");
    });
    let native_rate = native_batched_cartpole(n);
    report.push(Row {
        name: "cartpole batched, 256 envs (env-steps/s)".into(),
        value: plugin_rate,
        unit: "steps/s",
        baseline: Some(("native Rust".into(), native_rate)),
        target: Some(("≥ 10M/s".into(), plugin_rate >= 10e6)),
    });
    let name = "  vs Gymnasium CartPoleVectorEnv, 256 envs";
    match gymnasium(&peers, "vector_256") {
        Ok((label, gym)) => report.push(Row {
            name: name.into(),
            value: plugin_rate,
            unit: "steps/s",
            baseline: Some((label, gym)),
            target: None,
        }),
        Err(reason) => report.not_measured(name, "Gymnasium (gymnasium_cartpole.py)", reason),
    }

    // One un-batched step call.
    let mut env = cartpole.environment("{}")?;
    env.reset(Some(0))?;
    let mut flip = 0u32;
    let step_rate = rate(BUDGET, 1.0, || {
        flip ^= 1;
        let step = env.step(&Action::Discrete(flip)).expect("cartpole steps");
        if step.terminated || step.truncated {
            env.reset(None).expect("cartpole resets");
        }
    });
    let native_step = native_single_cartpole();
    report.push(Row {
        name: "cartpole single step call (latency)".into(),
        value: 1e6 / step_rate,
        unit: "µs",
        baseline: Some(("native Rust".into(), 1e6 / native_step)),
        target: Some(("≤ 2 µs".into(), 1e6 / step_rate <= 2.0)),
    });
    let name = "  vs gym.make(\"CartPole-v1\").step";
    match gymnasium(&peers, "single") {
        Ok((label, gym)) => report.push(Row {
            name: name.into(),
            value: 1e6 / step_rate,
            unit: "µs",
            baseline: Some((label, 1e6 / gym)),
            target: None,
        }),
        Err(reason) => report.not_measured(name, "Gymnasium (gymnasium_cartpole.py)", reason),
    }

    // Instantiation from the cache (a fresh store, instance and `init`).
    let math = runtime.load(plugin_dir.join("math-answer.wasm"), SandboxLimits::default())?;
    let instantiate_rate = rate(BUDGET, 1.0, || {
        std::hint::black_box(math.reward("{}").expect("instantiates"));
    });
    report.push(Row {
        name: "instantiate a reward plugin (+ init)".into(),
        value: 1e6 / instantiate_rate,
        unit: "µs",
        baseline: None,
        target: Some(("≤ 50 µs".into(), 1e6 / instantiate_rate <= 50.0)),
    });
    let load_start = Instant::now();
    let loads = 20;
    for _ in 0..loads {
        std::hint::black_box(runtime.load(plugin_dir.join("math-answer.wasm"), SandboxLimits::default())?);
    }
    report.push(Row {
        name: "load a plugin file from the artifact cache".into(),
        value: load_start.elapsed().as_secs_f64() * 1e6 / loads as f64,
        unit: "µs",
        baseline: None,
        target: None,
    });

    // math-answer on 10k completions of ~500 characters, in groups of 8.
    let groups = math_groups(10_000, 8);
    let mut reward = math.reward("{}")?;
    let completions = 10_000.0;
    let plugin_rate = rate(BUDGET * 2, completions, || {
        for chunk in groups.chunks(64) {
            reward.score(chunk).expect("math-answer scores");
        }
    });
    let native = MathAnswer::new(&Config::parse("{}", &MathAnswer::METADATA).map_err(anyhow::Error::msg)?)
        .map_err(anyhow::Error::msg)?;
    let native_rate = native_math_answer(native, &groups);
    report.push(Row {
        name: "math-answer scoring, 500-char completions".into(),
        value: plugin_rate,
        unit: "completions/s",
        baseline: Some(("native Rust".into(), native_rate)),
        target: Some(("≥ 200k/s".into(), plugin_rate >= 200e3)),
    });
    guest_math_answer(&runtime, plugin_dir, &groups, plugin_rate, &mut report)?;
    let _ = std::fs::remove_dir_all(&cache);
    Ok(report)
}

/// The Python and JavaScript ports of math-answer on the same completions, beside the Rust
/// plugin and beside the Python code called from Python (as TRL calls a reward function).
fn guest_math_answer(
    runtime: &PluginRuntime,
    plugin_dir: &Path,
    groups: &[Group],
    rust_rate: f64,
    report: &mut Report,
) -> anyhow::Result<()> {
    let file = std::env::temp_dir().join(format!("rein-bench-groups-{}.jsonl", std::process::id()));
    let lines: Vec<String> = groups
        .iter()
        .map(|g| serde_json::json!({"completions": g.completions, "reference": g.reference}).to_string())
        .collect();
    std::fs::write(&file, lines.join("\n"))?;
    let python_peer = plain_python_reward(&file);
    crate::python_package::adapter_rows(&file, &python_peer, report);
    let _ = std::fs::remove_file(&file);
    crate::python_package::trl_grpo_rows(report)?;
    let completions: usize = groups.iter().map(|g| g.completions.len()).sum();
    for (name, language) in [("math-answer-py", "Python"), ("math-answer-js", "JavaScript")] {
        let path = plugin_dir.join(format!("{name}.wasm"));
        if !path.exists() {
            println!("({} is not built: skipping it)", path.display());
            continue;
        }
        let compile = Instant::now();
        let plugin = runtime.load(&path, SandboxLimits::default())?;
        let compile_s = compile.elapsed().as_secs_f64();
        let mut reward = plugin.reward("{}")?;
        let plugin_rate = rate(BUDGET * 2, completions as f64, || {
            for chunk in groups.chunks(64) {
                reward.score(chunk).expect("the port scores");
            }
        });
        report.push(Row {
            name: format!("{name} ({language} plugin), same completions"),
            value: plugin_rate,
            unit: "completions/s",
            baseline: Some(("math-answer (Rust plugin)".into(), rust_rate)),
            target: None,
        });
        if language == "Python" {
            let row = format!("  {name} vs the same Python called from Python");
            match &python_peer {
                Ok((label, peer)) => report.push(Row {
                    name: row,
                    value: plugin_rate,
                    unit: "completions/s",
                    baseline: Some((label.clone(), *peer)),
                    target: None,
                }),
                Err(reason) => report.not_measured(row, "plain Python function (python_reward.py)", reason.clone()),
            }
        }
        report.push(Row {
            name: format!("  {name}: compile the component (first load)"),
            value: compile_s,
            unit: "s",
            baseline: None,
            target: None,
        });
    }
    Ok(())
}

/// completions/s of benches/peers/python_reward.py on the groups in `file` (`python3`,
/// standard library), with its label; why not, when it cannot run.
fn plain_python_reward(file: &Path) -> Result<(String, f64), String> {
    let value = crate::peers::run_with(Python::System, "python_reward.py", [file])?;
    crate::peers::describe("python_reward.py", &value);
    let rate = value["completions_per_s"].as_f64().ok_or("no `completions_per_s`")?;
    Ok((
        format!("plain Python function, TRL style ({})", crate::peers::versions(&value)),
        rate,
    ))
}

/// The same auto-resetting batch loop as the PDK's `vec-env`, without the sandbox.
fn native_batched_cartpole(n: usize) -> f64 {
    let config = Config::parse("{}", &CartPole::METADATA).expect("empty config");
    let mut envs: Vec<CartPole> = (0..n).map(|_| CartPole::new(&config).expect("cartpole")).collect();
    for (i, env) in envs.iter_mut().enumerate() {
        env.reset(Some(i as u64));
    }
    let actions: Vec<u32> = (0..n as u32).map(|i| (i * 7 + i / 3) % 2).collect();
    let mut observations = Vec::with_capacity(n * 4);
    let mut finals = Vec::new();
    let mut rewards = Vec::with_capacity(n);
    let mut flags = Vec::with_capacity(n);
    rate(BUDGET, n as f64, || {
        observations.clear();
        finals.clear();
        rewards.clear();
        flags.clear();
        for (env, &a) in envs.iter_mut().zip(&actions) {
            let Transition {
                reward,
                terminated,
                truncated,
            } = env.step(rein_pdk::Action::Discrete(a)).expect("steps");
            if terminated || truncated {
                env.write_observation(&mut finals);
                env.reset(None);
            }
            env.write_observation(&mut observations);
            rewards.push(reward);
            flags.push((terminated, truncated));
        }
        std::hint::black_box((&observations, &rewards, &flags, &finals));
    })
}

fn native_single_cartpole() -> f64 {
    let mut env = CartPole::new(&Config::parse("{}", &CartPole::METADATA).expect("config")).expect("cartpole");
    env.reset(Some(0));
    let mut flip = 0;
    rate(BUDGET, 1.0, || {
        flip ^= 1;
        let t = env.step(rein_pdk::Action::Discrete(flip)).expect("steps");
        std::hint::black_box(env.observation());
        if t.terminated || t.truncated {
            env.reset(None);
        }
    })
}

fn native_math_answer(mut reward: MathAnswer, groups: &[Group]) -> f64 {
    let pdk_groups: Vec<rein_pdk::Group> = groups
        .iter()
        .map(|g| rein_pdk::Group {
            prompt: g.prompt.clone(),
            completions: g.completions.clone(),
            reference: g.reference.clone(),
            metadata: g.metadata.clone(),
            tokens: Vec::new(),
            images: Vec::new(),
        })
        .collect();
    let total: usize = groups.iter().map(|g| g.completions.len()).sum();
    rate(BUDGET, total as f64, || {
        for group in &pdk_groups {
            std::hint::black_box(reward.score(group).expect("scores"));
        }
    })
}

/// `count` completions of ~500 characters of arithmetic prose ending in a boxed answer; half
/// are right.
fn math_groups(count: usize, per_group: usize) -> Vec<Group> {
    (0..count / per_group)
        .map(|g| {
            let answer = g * 37 % 1000;
            let completions = (0..per_group)
                .map(|c| {
                    let mut text = String::new();
                    while text.len() < 470 {
                        text.push_str(&format!("We add {} and {} to get {}. ", g + c, c * 3, g + 4 * c));
                    }
                    let given = if c % 2 == 0 { answer } else { answer + 1 };
                    text.truncate(470);
                    format!("{text} So the answer is \\boxed{{{given}}}.")
                })
                .collect();
            Group {
                prompt: format!("Problem {g}"),
                completions,
                reference: Some(answer.to_string()),
                metadata: String::new(),
                tokens: Vec::new(),
                images: Vec::new(),
            }
        })
        .collect()
}

/// Gymnasium's figures on this machine, if `.venv` has gymnasium (see benches/peers/).
fn gymnasium_peers() -> Result<serde_json::Value, String> {
    let value = crate::peers::run("gymnasium_cartpole.py", [""; 0])?;
    crate::peers::describe("gymnasium_cartpole.py", &value);
    Ok(value)
}

/// One of Gymnasium's figures (`key`) with its label, or why there is none.
fn gymnasium(peers: &Result<serde_json::Value, String>, key: &str) -> Result<(String, f64), String> {
    let value = peers.as_ref().map_err(Clone::clone)?;
    let figure = value[key].as_f64().ok_or_else(|| format!("no `{key}` in its output"))?;
    Ok((format!("Gymnasium ({})", crate::peers::versions(value)), figure))
}

//! Crash safety end to end: a real `rein run` child process is killed with SIGKILL at random
//! moments, resumed with `--resume`, and must end with exactly the metrics of an uninterrupted
//! run of the same seed (timings aside), having redone at most one checkpoint interval per kill.

#[path = "../../../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn scratch(tag: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("resume-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A recipe with overrides, run into its own `runs` directory.
struct Job {
    recipe: &'static str,
    overrides: Vec<String>,
    /// `train.checkpoint_every`.
    every: usize,
}

impl Job {
    fn command(&self, runs: &Path, resume: Option<&Path>) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rein"));
        command
            .arg("run")
            .arg(root().join(self.recipe))
            .arg("--plugin-dir")
            .arg(common::plugin_path("math-answer").parent().unwrap())
            .arg("--set")
            .arg(format!("train.runs_dir={:?}", runs.display().to_string()))
            .arg("--set")
            .arg(format!("train.checkpoint_every={}", self.every))
            .env(
                "REIN_CACHE_DIR",
                Path::new(env!("CARGO_TARGET_TMPDIR")).join("component-cache"),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for o in &self.overrides {
            command.arg("--set").arg(o);
        }
        if let Some(dir) = resume {
            command.arg("--resume").arg(dir);
        }
        command
    }
}

fn succeeded(out: Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "rein run failed:\n{stderr}");
    stderr
}

/// The one run directory under `runs`.
fn run_dir(runs: &Path) -> PathBuf {
    let dirs: Vec<PathBuf> = std::fs::read_dir(runs).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(dirs.len(), 1, "one run directory expected in {}", runs.display());
    dirs[0].clone()
}

/// Training steps logged so far (metric lines that are not evaluations); 0 before the file
/// exists.
fn steps_logged(dir: Option<&PathBuf>) -> usize {
    let Some(text) = dir.and_then(|d| std::fs::read_to_string(d.join("metrics.jsonl")).ok()) else {
        return 0;
    };
    text.lines()
        .filter(|l| l.ends_with('}') && !l.contains("\"stage\":\"eval\""))
        .count()
}

/// xorshift64*: the kill points, reproducible from the printed seed.
struct Random(u64);

impl Random {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

fn seed() -> u64 {
    let seed = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("kill points from seed {seed}");
    seed
}

/// Waits until `child` has logged at least `steps` steps (or has exited), then a random few
/// milliseconds more, and kills it with SIGKILL. Returns the steps logged at the kill, or
/// `None` when the child finished first.
fn kill_after(child: &mut Child, runs: &Path, steps: usize, random: &mut Random) -> Option<usize> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if child.try_wait().unwrap().is_some() {
            return None;
        }
        let dir = std::fs::read_dir(runs)
            .ok()
            .and_then(|mut d| d.next())
            .map(|e| e.unwrap().path());
        if steps_logged(dir.as_ref()) >= steps {
            break;
        }
        assert!(Instant::now() < deadline, "no progress to step {steps}");
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(random.below(25)));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    Some(steps_logged(Some(&run_dir(runs))))
}

/// The checkpoint a resume started from, from its `resuming … from …/step-N.ckpt` line.
fn resumed_from(stderr: &str) -> Option<usize> {
    let line = stderr.lines().find(|l| l.starts_with("resuming "))?;
    let file = line.rsplit('/').next()?;
    file.strip_prefix("step-")?.strip_suffix(".ckpt")?.parse().ok()
}

/// Flips one byte in the middle of the newest checkpoint.
fn corrupt_newest_checkpoint(dir: &Path) -> Option<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("checkpoints"))
        .ok()?
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ckpt"))
        .collect();
    files.sort();
    let newest = files.pop()?;
    let mut bytes = std::fs::read(&newest).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x5A;
    std::fs::write(&newest, bytes).unwrap();
    Some(newest)
}

/// Runs `job` once straight through, and once killed `kills` times at random steps and resumed
/// each time (the newest checkpoint corrupted before one of the resumes); the metrics must be
/// equal.
fn killed_and_resumed_equals_uninterrupted(job: &Job, total_steps: usize, kills: usize) {
    // Each job its own directories: the tests run in parallel.
    let tag = Path::new(job.recipe)
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let reference_runs = scratch(&format!("{tag}-{}-reference", job.every));
    succeeded(job.command(&reference_runs, None).output().unwrap());
    let reference = common::metrics_without_timings(&run_dir(&reference_runs));

    let mut random = Random(seed());
    let runs = scratch(&format!("{tag}-{}-killed", job.every));
    // Kill points well before the end, so the last resume still has work to do.
    let mut kill_at: Vec<usize> = (0..kills)
        .map(|_| 1 + random.below(total_steps as u64 - 2) as usize)
        .collect();
    kill_at.sort();
    let corrupt_at = random.below(kills as u64) as usize;
    let mut resume: Option<PathBuf> = None;
    // Steps logged at the last kill, and the checkpoint corrupted after it.
    let mut last_kill: Option<(usize, Option<PathBuf>)> = None;
    for (i, &at) in kill_at.iter().enumerate() {
        let (logged, stderr) = run_until_killed(job.command(&runs, resume.as_deref()), &runs, at, &mut random);
        // A whole line: one cut by the kill says nothing about what it read.
        let said = |what: &str| {
            stderr
                .split_inclusive('\n')
                .any(|l| l.contains(what) && l.ends_with('\n'))
        };
        let started = resume.is_none() || said("resuming ") || said("has no usable checkpoint");
        if !started {
            // Killed before it read a checkpoint (it only reads until then): as if not run.
            eprintln!("killed before resuming");
            continue;
        }
        if let Some((before, corrupted)) = last_kill.take() {
            check_resume(&stderr, before, job.every, corrupted.as_deref());
        }
        let Some(logged) = logged else {
            assert!(
                i > 0,
                "the run finished before its first kill point; nothing was tested"
            );
            break;
        };
        eprintln!("killed after {logged} steps");
        let run = run_dir(&runs);
        let corrupted = (i == corrupt_at).then(|| corrupt_newest_checkpoint(&run)).flatten();
        last_kill = Some((logged, corrupted));
        resume = Some(run);
    }
    let run = run_dir(&runs);
    let stderr = succeeded(job.command(&runs, Some(&run)).output().unwrap());
    if let Some((before, corrupted)) = last_kill {
        check_resume(&stderr, before, job.every, corrupted.as_deref());
    }
    let resumed = common::metrics_without_timings(&run);
    assert_eq!(resumed.len(), reference.len(), "number of metric lines");
    for (line, (a, b)) in reference.iter().zip(&resumed).enumerate() {
        assert_eq!(a, b, "metrics.jsonl line {} differs", line + 1);
    }
}

/// Starts `command`, kills it once it has logged `steps` steps, and returns the steps logged
/// at the kill (`None` when it finished first) and what it printed.
fn run_until_killed(mut command: Command, runs: &Path, steps: usize, random: &mut Random) -> (Option<usize>, String) {
    use std::io::Read;
    let mut child = command.spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let logged = kill_after(&mut child, runs, steps, random);
    (logged, reader.join().unwrap())
}

/// A resume after a kill at `logged` steps starts at most one checkpoint interval back (two
/// when it skipped a corrupt checkpoint, which it must report: the one corrupted on purpose
/// after this kill, or one corrupted earlier that a run killed again before rewriting it left
/// in place).
fn check_resume(stderr: &str, logged: usize, every: usize, corrupted: Option<&Path>) {
    let from = resumed_from(stderr).unwrap_or_else(|| {
        assert!(stderr.contains("has no usable checkpoint"), "{stderr}");
        0
    });
    let mut allowed = every;
    if let Some(file) = corrupted {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            stderr.contains(&format!("{name} is corrupt: checksum mismatch")),
            "the corrupt {name} was not reported:\n{stderr}"
        );
    }
    if stderr.contains("is corrupt: checksum mismatch") {
        allowed *= 2;
    }
    assert!(
        logged - from <= allowed,
        "resumed from step {from} after {logged} steps had been logged:\n{stderr}"
    );
}

#[test]
fn ppo_killed_at_random_updates_resumes_to_the_same_metrics() {
    let job = Job {
        recipe: "recipes/ppo-cartpole.toml",
        overrides: vec![
            "train.total_steps=16384".into(), // 64 updates of 8 × 32 steps
            "train.stop_at_return=1e9".into(),
            "train.eval_episodes=2".into(),
        ],
        every: 4,
    };
    killed_and_resumed_equals_uninterrupted(&job, 64, 3);
}

/// SAC and TD3 checkpoint their networks, targets, optimisers, temperature and the replay
/// buffer: a resumed run samples the same batches and ends as the uninterrupted one.
#[test]
fn sac_and_td3_killed_at_random_steps_resume_to_the_same_metrics() {
    for recipe in ["recipes/sac-pendulum.toml", "recipes/td3-pendulum.toml"] {
        let job = Job {
            recipe,
            overrides: [
                "train.total_steps=1500", // 30 records of 50 steps, 1 300 updates
                "algorithm.log_every=50",
                "algorithm.learning_starts=200",
                "algorithm.batch_size=32",
                "model.hidden=[16, 16]",
                "train.stop_at_return=1e9",
                "train.eval_episodes=1",
            ]
            .map(String::from)
            .to_vec(),
            every: 4,
        };
        killed_and_resumed_equals_uninterrupted(&job, 30, 2);
    }
}

/// GRPO with difficulty pools, difficulty weights and the adaptive entropy coefficient: the pass
/// rates and the coefficient are in the checkpoint, so a resumed run draws the same prompts and
/// applies the same bonus.
#[test]
fn sft_then_grpo_killed_at_random_steps_resumes_to_the_same_metrics() {
    let job = Job {
        recipe: "recipes/grpo-arithmetic.toml",
        overrides: [
            "data.task.train=400",
            "data.task.test=8",
            "sft.steps=12",
            "sft.batch_size=8",
            "algorithm.steps=8",
            "algorithm.prompts_per_step=2",
            "algorithm.kl_coef=0.05",
            "algorithm.difficulty_weight={}",
            // A target no entropy reaches: the coefficient grows by delta every update.
            "algorithm.adaptive_entropy={ target = 100.0, delta = 0.01 }",
            "curriculum.kind=\"pools\"",
            "curriculum.hard=0.5",
            "sampler.n=4",
            "sampler.max_new_tokens=12",
            "eval.k=2",
        ]
        .map(String::from)
        .to_vec(),
        every: 3,
    };
    killed_and_resumed_equals_uninterrupted(&job, 20, 3);
}

/// GRPO with a UCB curriculum over the task's digit lengths: the sources' windows and counts
/// are in the checkpoint, so a resumed run draws the same sources and prompts.
#[test]
fn grpo_with_a_ucb_curriculum_killed_at_random_steps_resumes_to_the_same_metrics() {
    let job = Job {
        recipe: "recipes/grpo-arithmetic-mixed.toml",
        overrides: [
            "data.task.train=400",
            "data.task.test=8",
            "sft.steps=8",
            "sft.batch_size=8",
            "algorithm.steps=8",
            "algorithm.prompts_per_step=3",
            "curriculum.window=10",
            "sampler.n=4",
            "sampler.max_new_tokens=12",
            "eval.k=2",
        ]
        .map(String::from)
        .to_vec(),
        every: 3,
    };
    killed_and_resumed_equals_uninterrupted(&job, 16, 2);
}

/// PRIME's implicit PRM checkpoints its weights and optimiser beside the policy (its reference
/// is the model the stage starts from): a resumed run rewards and ends as the uninterrupted one.
#[test]
fn sft_then_grpo_with_an_implicit_prm_killed_at_random_steps_resumes_to_the_same_metrics() {
    let job = Job {
        recipe: "recipes/grpo-prime-arithmetic.toml",
        overrides: [
            "data.task.train=400",
            "data.task.test=8",
            "sft.steps=8",
            "sft.batch_size=8",
            "algorithm.steps=8",
            "algorithm.prompts_per_step=2",
            "implicit_prm.lr=1e-3",
            "sampler.n=4",
            "sampler.max_new_tokens=12",
            "eval.k=2",
        ]
        .map(String::from)
        .to_vec(),
        every: 3,
    };
    killed_and_resumed_equals_uninterrupted(&job, 16, 2);
}

/// PPO with a critic checkpoints the value model and its optimiser beside the policy, and the
/// minibatch shuffles' generator: a resumed run ends as the uninterrupted one.
#[test]
fn sft_then_ppo_with_a_critic_killed_at_random_steps_resumes_to_the_same_metrics() {
    let job = Job {
        recipe: "recipes/ppo-arithmetic.toml",
        overrides: [
            "data.task.train=400",
            "data.task.test=8",
            "sft.steps=4",
            "sft.batch_size=8",
            "algorithm.steps=12",
            "algorithm.prompts_per_step=2",
            "algorithm.num_minibatches=2",
            "sampler.n=2",
            "sampler.max_new_tokens=12",
            "eval.k=2",
        ]
        .map(String::from)
        .to_vec(),
        every: 3,
    };
    // A short SFT stage: most kill points fall in PPO.
    killed_and_resumed_equals_uninterrupted(&job, 16, 3);
}

/// DPO keeps the reference's log-probabilities of the pairs it has drawn in its checkpoints: a
/// resumed run reuses them and ends as the uninterrupted one.
#[test]
fn sft_then_dpo_killed_at_random_steps_resumes_to_the_same_metrics() {
    let job = Job {
        recipe: "recipes/dpo-arithmetic.toml",
        overrides: [
            "data.task.train=400",
            "data.task.test=8",
            "sft.steps=12",
            "sft.batch_size=8",
            "algorithm.steps=10",
            "algorithm.batch_size=4",
            "sampler.max_new_tokens=12",
            "eval.k=2",
        ]
        .map(String::from)
        .to_vec(),
        every: 3,
    };
    killed_and_resumed_equals_uninterrupted(&job, 22, 3);
}

/// KTO, likewise, keeps the reference's log-probabilities of the completions it has drawn and
/// the generator that draws its batches.
#[test]
fn sft_then_kto_killed_at_random_steps_resumes_to_the_same_metrics() {
    let job = Job {
        recipe: "recipes/kto-arithmetic.toml",
        overrides: [
            "data.task.train=400",
            "data.task.test=8",
            "sft.steps=12",
            "sft.batch_size=8",
            "algorithm.steps=10",
            "algorithm.batch_size=4",
            "sampler.max_new_tokens=12",
            "eval.k=2",
        ]
        .map(String::from)
        .to_vec(),
        every: 3,
    };
    killed_and_resumed_equals_uninterrupted(&job, 22, 3);
}

/// A reward model after an SFT stage: killed in either stage, it resumes in that stage.
#[test]
fn sft_then_reward_model_killed_at_random_steps_resumes_to_the_same_metrics() {
    let job = Job {
        recipe: "recipes/rm-arithmetic.toml",
        overrides: [
            "data.task.train=400",
            "data.task.test=8",
            "sft.steps=10",
            "sft.batch_size=8",
            "algorithm.steps=12",
            "algorithm.batch_size=4",
            "algorithm.eval_every=4",
        ]
        .map(String::from)
        .to_vec(),
        every: 3,
    };
    killed_and_resumed_equals_uninterrupted(&job, 22, 3);
}

/// A process reward model after an SFT stage, likewise.
#[test]
fn sft_then_process_reward_model_killed_at_random_steps_resumes_to_the_same_metrics() {
    let job = Job {
        recipe: "recipes/prm-arithmetic.toml",
        overrides: [
            "data.task.train=400",
            "data.task.test=8",
            "sft.steps=10",
            "sft.batch_size=8",
            "algorithm.steps=12",
            "algorithm.batch_size=4",
            "algorithm.eval_every=4",
        ]
        .map(String::from)
        .to_vec(),
        every: 3,
    };
    killed_and_resumed_equals_uninterrupted(&job, 22, 3);
}

#[test]
fn ctrl_c_saves_a_checkpoint_at_once_and_the_run_resumes_from_it() {
    let job = Job {
        recipe: "recipes/ppo-cartpole.toml",
        overrides: vec![
            "train.total_steps=16384".into(),
            "train.stop_at_return=1e9".into(),
            "train.eval_episodes=2".into(),
        ],
        every: 1000, // no periodic checkpoint: only the one Ctrl-C asks for
    };
    let reference_runs = scratch("ctrl-c-reference");
    succeeded(job.command(&reference_runs, None).output().unwrap());
    let reference = common::metrics_without_timings(&run_dir(&reference_runs));

    let runs = scratch("ctrl-c");
    let child = job.command(&runs, None).spawn().unwrap();
    while steps_logged(
        std::fs::read_dir(&runs)
            .unwrap()
            .next()
            .map(|e| e.unwrap().path())
            .as_ref(),
    ) < 10
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an interrupted run exits with an error");
    assert!(stderr.contains("interrupted after step"), "{stderr}");
    assert!(stderr.contains("continue with `--resume"), "{stderr}");
    let run = run_dir(&runs);
    let stopped_at = steps_logged(Some(&run));
    let resumed = succeeded(job.command(&runs, Some(&run)).output().unwrap());
    // Nothing is lost: the checkpoint is of the last step logged.
    assert_eq!(resumed_from(&resumed), Some(stopped_at), "{resumed}");
    assert_eq!(common::metrics_without_timings(&run), reference);
}

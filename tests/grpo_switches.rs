//! Each GRPO switch docs/algorithms.md documents, observed in what a step does: the test fails when
//! the switch is made a no-op. One real step (or a few) on the tiny Qwen2 fixture, with a
//! scripted reward in Rust so that which groups carry signal is known exactly.

use std::path::Path;

use rein_core::{
    AdvantageKind, Aggregation, EpisodeStart, KlEstimator, Message, MultiObjectiveAggregation, ObjectiveKind, Opening,
    PluginError, RatioLevel, Reply, SamplerPrecision, SamplerSignal, StdScaling, StepScore, TextEnv, Turn,
};
use rein_posttrain::SignalReward;
use rein_posttrain::rollout::episodes::Agent;
use rein_recipe::{CurriculumSection, GrpoSection, ImplicitPrmSection, ImplicitPrmUpdate, SamplerSection};

#[path = "common/grpo_trace.rs"]
mod grpo_trace;

use grpo_trace::{Run, Trace};

/// Alternating 0, 1, 0, 1 within every group: each group has signal.
fn alternating(_: &str, i: usize) -> f64 {
    (i % 2) as f64
}

/// The same reward for every completion: no group has signal.
fn constant(_: &str, _: usize) -> f64 {
    1.0
}

/// Signal only in the groups of prompts that start with "mixed".
fn mixed_only(prompt: &str, i: usize) -> f64 {
    if prompt.starts_with("mixed") {
        (i % 2) as f64
    } else {
        1.0
    }
}

fn run(grpo: GrpoSection, sampler: SamplerSection, prompts: &[&str], reward: fn(&str, usize) -> f64) -> Trace {
    run_with(grpo, sampler, prompts, reward, None, None)
}

fn run_with(
    grpo: GrpoSection,
    sampler: SamplerSection,
    prompts: &[&str],
    reward: fn(&str, usize) -> f64,
    agent: Option<&mut Agent>,
    curriculum: Option<&CurriculumSection>,
) -> Trace {
    let qwen2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lm/qwen2-gqa");
    run_model(&qwen2, grpo, sampler, prompts, reward, agent, curriculum)
}

/// [`run_with`] on the model at `dir` (a checkpoint directory or a `.gguf` file).
fn run_model(
    dir: &Path,
    grpo: GrpoSection,
    sampler: SamplerSection,
    prompts: &[&str],
    reward: fn(&str, usize) -> f64,
    agent: Option<&mut Agent>,
    curriculum: Option<&CurriculumSection>,
) -> Trace {
    Run {
        grpo,
        sampler,
        prompts,
        reward,
        agent,
        curriculum,
        devices: 1,
        lora: None,
        signals: &[],
        steps: None,
        implicit_prm: None,
        tree: None,
    }
    .trace(dir)
}

fn grpo(steps: usize) -> GrpoSection {
    GrpoSection {
        steps,
        prompts_per_step: 2,
        ..GrpoSection::default()
    }
}

fn sampler(max_new_tokens: usize) -> SamplerSection {
    SamplerSection {
        temperature: 1.0,
        max_new_tokens,
        n: 4,
        ..SamplerSection::default()
    }
}

const PROMPTS: [&str; 4] = ["one plus one", "two plus two", "three", "four"];

#[test]
fn mask_truncated_completions_contribute_no_gradient() {
    let masked = run(
        GrpoSection {
            mask_truncated: true,
            ..grpo(1)
        },
        sampler(3),
        &PROMPTS,
        alternating,
    );
    assert_eq!(
        masked.value(1, "train/truncated_frac"),
        1.0,
        "this seed truncates every completion"
    );
    assert!(!masked.moved(), "only truncated completions, all masked: nothing moves");
    let unmasked = run(grpo(1), sampler(3), &PROMPTS, alternating);
    assert!(unmasked.moved(), "the same batch unmasked does move the policy");
}

#[test]
fn the_entropy_bonus_alone_moves_the_policy() {
    // Equal rewards: every advantage is zero, so only the entropy bonus has a gradient.
    let without = run(grpo(1), sampler(4), &PROMPTS, constant);
    assert!(!without.moved());
    assert!(without.records[0]["train/entropy"].is_null());
    let with = run(
        GrpoSection {
            entropy_coef: 0.1,
            ..grpo(1)
        },
        sampler(4),
        &PROMPTS,
        constant,
    );
    assert!(with.moved(), "the entropy bonus has a gradient");
    assert!(with.value(1, "train/entropy") > 0.0);
}

#[test]
fn kl_in_reward_subtracts_the_penalty_from_the_logged_reward() {
    let section = |kl_in_reward| GrpoSection {
        kl_coef: 0.5,
        kl_estimator: KlEstimator::K3,
        kl_in_reward,
        ..grpo(2)
    };
    let folded = run(section(true), sampler(6), &PROMPTS, alternating);
    // Step 2 samples from a policy one update away from the reference.
    let (score, reward) = (
        folded.value(2, "train/reward/scripted"),
        folded.value(2, "train/reward"),
    );
    let (kl, penalty) = (folded.value(2, "train/kl"), folded.value(2, "train/kl_penalty"));
    assert!(kl > 0.0 && penalty > 0.0, "KL {kl}, penalty {penalty}");
    assert!(
        (reward - (score - penalty)).abs() < 1e-6,
        "reward {reward} = score {score} − β·KL {penalty}"
    );
    let in_loss = run(section(false), sampler(6), &PROMPTS, alternating);
    assert!(in_loss.value(2, "train/kl") > 0.0, "the KL in the loss is logged too");
    assert_eq!(
        in_loss.value(2, "train/reward"),
        in_loss.value(2, "train/reward/scripted"),
        "with the KL in the loss the reward is the rewards' alone"
    );
}

/// 0 or 1 alternately, scaled by the prompt's length: groups differ in spread, so whitening
/// the batch is not normalising each group.
fn graded(prompt: &str, i: usize) -> f64 {
    (i % 2) as f64 * prompt.len() as f64 / 4.0
}

#[test]
fn every_advantage_scaling_ratio_objective_token_aggregation_and_kl_switch_changes_the_update() {
    // Two updates per batch, so that the second one sees ratios away from 1 (where the token
    // and sequence ratios part), and two steps, so that step 2 samples away from the reference
    // (where the KL term has a gradient).
    let base = GrpoSection {
        updates_per_batch: 2,
        ..grpo(2)
    };
    // A stop string the random model writes now and then: completions of several lengths,
    // which tell the aggregations apart.
    let sampler = || SamplerSection {
        stop: vec!["e".into()],
        ..sampler(12)
    };
    let reference = run(base.clone(), sampler(), &PROMPTS, graded);
    let truncated = reference.value(1, "train/truncated_frac");
    assert!(0.0 < truncated && truncated < 1.0, "truncated fraction {truncated}");
    let switches = [
        (
            "advantage = rloo",
            GrpoSection {
                advantage: AdvantageKind::Rloo,
                ..base.clone()
            },
        ),
        (
            "advantage = reinforce++",
            GrpoSection {
                advantage: AdvantageKind::ReinforcePp,
                ..base.clone()
            },
        ),
        (
            "advantage = pass_at_k, pass_k = 2",
            GrpoSection {
                advantage: AdvantageKind::PassAtK,
                pass_k: Some(2),
                ..base.clone()
            },
        ),
        (
            "multi_objective_aggregation = normalize_then_sum",
            GrpoSection {
                multi_objective_aggregation: MultiObjectiveAggregation::NormalizeThenSum,
                ..base.clone()
            },
        ),
        (
            "std_scaling = batch",
            GrpoSection {
                std_scaling: StdScaling::Batch,
                ..base.clone()
            },
        ),
        (
            "std_scaling = none",
            GrpoSection {
                std_scaling: StdScaling::None,
                ..base.clone()
            },
        ),
        (
            "ratio_level = sequence",
            GrpoSection {
                ratio_level: RatioLevel::Sequence,
                ..base.clone()
            },
        ),
        (
            "aggregation = token-mean",
            GrpoSection {
                aggregation: Aggregation::TokenMean,
                ..base.clone()
            },
        ),
        (
            "aggregation = seq-mean-token-sum-norm",
            GrpoSection {
                aggregation: Aggregation::SeqMeanTokenSumNorm,
                ..base.clone()
            },
        ),
        (
            "kl_coef = 0.5",
            GrpoSection {
                kl_coef: 0.5,
                ..base.clone()
            },
        ),
        (
            "objective = cispo",
            GrpoSection {
                objective: ObjectiveKind::Cispo,
                ..base.clone()
            },
        ),
        (
            "objective = sapo",
            GrpoSection {
                objective: ObjectiveKind::Sapo,
                ..base.clone()
            },
        ),
        (
            "adaptive_entropy = { target = 100 }",
            GrpoSection {
                adaptive_entropy: Some(rein_core::AdaptiveEntropy {
                    target: 100.0,
                    ..Default::default()
                }),
                ..base.clone()
            },
        ),
        (
            "top_entropy_quantile = 0.2",
            GrpoSection {
                top_entropy_quantile: 0.2,
                ..base.clone()
            },
        ),
        (
            "updates_per_batch = 1",
            GrpoSection {
                updates_per_batch: 1,
                ..base.clone()
            },
        ),
    ];
    for (switch, section) in switches {
        let trace = run(section, sampler(), &PROMPTS, graded);
        assert!(trace.moved(), "{switch}: the policy did not move");
        assert!(trace.after != reference.after, "{switch} trains exactly as without it");
    }
}

#[test]
fn cispos_cap_and_sapos_temperatures_change_the_update() {
    // The second update of each batch sees weights away from 1: a cap of 0.5 holds every
    // weight below 1 (CISPO), and a temperature of 20 bends SAPO's gate where one of 1 is
    // nearly straight.
    let section = |objective, cispo_max_weight, sapo_temperature| GrpoSection {
        updates_per_batch: 2,
        objective,
        cispo_max_weight,
        sapo_temperature_pos: sapo_temperature,
        sapo_temperature_neg: sapo_temperature,
        ..grpo(2)
    };
    for (switch, default, set) in [
        (
            "cispo_max_weight = 0.5",
            section(ObjectiveKind::Cispo, None, None),
            section(ObjectiveKind::Cispo, Some(0.5), None),
        ),
        (
            "sapo_temperature_pos = sapo_temperature_neg = 20",
            section(ObjectiveKind::Sapo, None, None),
            section(ObjectiveKind::Sapo, None, Some(20.0)),
        ),
    ] {
        let default = run(default, sampler(8), &PROMPTS, graded);
        let set = run(set, sampler(8), &PROMPTS, graded);
        assert!(set.moved(), "{switch}: the policy did not move");
        assert!(set.after != default.after, "{switch} trains exactly as without it");
    }
}

/// 0, 1, 2, 3 within every group: a strict best in each.
fn ranked(_: &str, i: usize) -> f64 {
    i as f64
}

#[test]
fn grpo_passk_trains_only_through_each_groups_strict_best() {
    let passk = GrpoSection {
        advantage: AdvantageKind::GrpoPassk,
        ..grpo(1)
    };
    let group = run(grpo(1), sampler(8), &PROMPTS, ranked);
    let best = run(passk.clone(), sampler(8), &PROMPTS, ranked);
    assert!(best.moved(), "grpo_passk: the policy did not move");
    assert!(
        best.after != group.after,
        "grpo_passk trains exactly as group advantages"
    );
    // Two completions tie for the best in every group: no margin, so nothing moves.
    let tied = run(passk, sampler(8), &PROMPTS, alternating);
    assert!(
        !tied.moved(),
        "grpo_passk moved the policy on groups without a strict best"
    );
}

#[test]
fn pass_k_changes_the_update() {
    // Two of four completions right in every group: pass@2 counts such a group solved more
    // often than pass@1 does, and shrinks its advantages.
    let section = |k| GrpoSection {
        advantage: AdvantageKind::PassAtK,
        pass_k: Some(k),
        ..grpo(1)
    };
    let one = run(section(1), sampler(8), &PROMPTS, alternating);
    let two = run(section(2), sampler(8), &PROMPTS, alternating);
    assert!(two.moved(), "pass_k = 2: the policy did not move");
    assert!(two.after != one.after, "pass_k = 2 trains exactly as pass_k = 1");
}

/// A reward from the sampler's own certainty gives groups whose scripted reward is constant
/// something to learn from: without it the step has no signal and leaves the policy as it was.
/// Its mean is logged under its name: self-certainty at least `log V` (it is `KL(U ‖ p) + log V`),
/// the negative entropy at most 0.
#[test]
fn a_certainty_signal_alone_moves_the_policy() {
    let signal = |signal: SamplerSignal| SignalReward {
        name: signal.name().into(),
        weight: 1.0,
        signal,
    };
    let trace = |signals: &[SignalReward]| {
        let qwen2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lm/qwen2-gqa");
        Run {
            grpo: grpo(1),
            sampler: sampler(6),
            prompts: &PROMPTS,
            reward: constant,
            agent: None,
            curriculum: None,
            devices: 1,
            lora: None,
            signals,
            steps: None,
            implicit_prm: None,
            tree: None,
        }
        .trace(&qwen2)
    };
    assert!(!trace(&[]).moved(), "a constant reward teaches nothing");
    let sure = trace(&[signal(SamplerSignal::SelfCertainty)]);
    assert!(sure.moved());
    let vocab = 512f64;
    assert!(sure.value(1, "train/reward/self_certainty") >= vocab.ln() - 1e-4);
    let calm = trace(&[signal(SamplerSignal::NegativeEntropy)]);
    assert!(calm.moved());
    let entropy = -calm.value(1, "train/reward/negative_entropy");
    assert!(entropy > 0.0 && entropy <= vocab.ln() + 1e-4, "{entropy}");
    assert_ne!(sure.after, calm.after, "each signal ranks the completions its own way");
}

#[test]
fn dynamic_sampling_replaces_groups_without_signal() {
    let prompts = ["same one", "same two", "mixed three", "mixed four", "same five"];
    let section = |dynamic_sampling| GrpoSection {
        dynamic_sampling,
        max_resample: 8,
        ..grpo(3)
    };
    let dynamic = run(section(true), sampler(3), &prompts, mixed_only);
    for step in 1..=3 {
        // Only "mixed" groups are kept, each scoring 0, 1, 0, 1.
        assert_eq!(dynamic.value(step, "train/reward"), 0.5, "step {step}");
    }
    let resampled: f64 = (1..=3).map(|s| dynamic.value(s, "train/resampled_groups")).sum();
    assert!(resampled >= 1.0, "groups were dropped and replaced: {resampled}");
    let plain = run(section(false), sampler(3), &prompts, mixed_only);
    assert!(
        (1..=3).any(|s| plain.value(s, "train/reward") != 0.5),
        "without dynamic sampling, groups without signal stay in the batch"
    );
    assert!((1..=3).all(|s| plain.value(s, "train/resampled_groups") == 0.0));
}

/// An easy prompt's group gets 3 of 4 completions right, a hard prompt's 1 of 4.
fn easy_and_hard(prompt: &str, i: usize) -> f64 {
    match prompt.starts_with("easy") {
        true => f64::from(i != 0),
        false => f64::from(i == 0),
    }
}

/// `difficulty_weight` scales each group by its own accuracy (ρ = 0.75 and 0.25 here): with the
/// defaults, by hand, a correct answer weighs w(0.75) = 0.95 in the easy group and
/// w(0.25) = 0.4 + 1.1 / (1 + e^−5) = 1.4926379 in the hard one, a mean of 1.2213189; and since
/// it weighs the groups unequally, the update differs from the unweighted one.
#[test]
fn difficulty_weight_scales_each_group_by_its_accuracy() {
    let prompts = ["easy one", "hard two"];
    let weighted = GrpoSection {
        difficulty_weight: Some(rein_core::DifficultyWeight::default()),
        ..grpo(1)
    };
    let trace = run(weighted, sampler(3), &prompts, easy_and_hard);
    let mean_weight = trace.value(1, "train/difficulty_weight");
    assert!(
        (mean_weight - (0.95 + 1.492_637_86) / 2.0).abs() < 1e-6,
        "{mean_weight}"
    );
    let plain = run(grpo(1), sampler(3), &prompts, easy_and_hard);
    assert!(plain.records[0].get("train/difficulty_weight").is_none());
    assert!(trace.moved() && plain.moved());
    assert!(trace.after != plain.after, "the weights change the update");
}

/// Two prompts of each difficulty (the first word, also their source).
const BY_DIFFICULTY: [&str; 6] = [
    "easy one",
    "easy two",
    "hard three",
    "hard four",
    "mixed five",
    "mixed six",
];

/// Every completion of an "easy" prompt is right, none of a "hard" one, half of a "mixed" one.
fn by_difficulty(prompt: &str, i: usize) -> f64 {
    match prompt.split(' ').next() {
        Some("easy") => 1.0,
        Some("hard") => 0.0,
        _ => (i % 2) as f64,
    }
}

/// Difficulty pools with no share for the easy and hard pools: a prompt's first group (pass rate
/// 1 or 0, smoothing 0) moves an easy or hard prompt out of the normal pool for good, so each
/// is drawn in one step at most, and once every prompt has been seen only the mixed ones are.
#[test]
fn difficulty_pools_stop_drawing_prompts_that_teach_nothing() {
    let prompts = BY_DIFFICULTY;
    let pools = CurriculumSection {
        easy: 0.0,
        hard: 0.0,
        smoothing: 0.0,
        ..CurriculumSection::default()
    };
    let trace = run_with(grpo(12), sampler(2), &prompts, by_difficulty, None, Some(&pools));
    let mut steps_of: std::collections::BTreeMap<String, Vec<usize>> = Default::default();
    for (step, record) in trace.records.iter().enumerate() {
        for sample in record["samples"].as_array().unwrap() {
            let prompt = sample["prompt"].as_str().unwrap().to_string();
            steps_of.entry(prompt).or_default().push(step + 1);
        }
    }
    for (prompt, steps) in &steps_of {
        let first = steps[0];
        if !prompt.starts_with("mixed") {
            assert!(
                steps.iter().all(|&s| s == first),
                "{prompt} drawn again after its first group: {steps:?}"
            );
        }
    }
    let last = trace.records.last().unwrap();
    let sizes =
        ["easy", "normal", "hard"].map(|p| last[format!("train/curriculum/{p}_prompts").as_str()].as_u64().unwrap());
    assert_eq!(sizes.iter().sum::<u64>(), 6);
    assert_eq!(
        sizes[1],
        2 + (4 - sizes[0] - sizes[2]),
        "only unseen easy/hard prompts stay normal"
    );
    assert!(
        sizes[0] + sizes[2] >= 2,
        "some easy or hard prompts were seen: {sizes:?}"
    );
    // Without the curriculum, some easy or hard prompt comes back.
    let plain = run_with(grpo(12), sampler(2), &prompts, by_difficulty, None, None);
    let repeats = (prompts.iter().filter(|p| !p.starts_with("mixed")))
        .map(|p| {
            (plain.records.iter())
                .filter(|r| r["samples"].as_array().unwrap().iter().any(|s| s["prompt"] == *p))
                .count()
        })
        .max()
        .unwrap();
    assert!(repeats > 1, "the shuffled order draws every prompt again");
}

#[test]
fn dual_clip_bounds_the_loss_once_ratios_move() {
    // The second update of a batch sees ratios away from 1; with c = 1.01 every
    // negative-advantage token whose ratio grew past 1.01 has its loss capped at −c·Â.
    let section = |dual_clip| GrpoSection {
        updates_per_batch: 2,
        dual_clip,
        ..grpo(1)
    };
    let plain = run(section(None), sampler(6), &PROMPTS, alternating);
    let capped = run(section(Some(1.01)), sampler(6), &PROMPTS, alternating);
    let (plain, capped) = (plain.value(1, "train/loss"), capped.value(1, "train/loss"));
    assert!(capped < plain - 1e-6, "dual clip {capped} vs none {plain}");
}

/// A text environment in Rust: it answers each of the model's turns with a user message, and
/// after its third turn says done, rewarding the turn's length parity.
#[derive(Default)]
struct Echo {
    /// Turns seen, per episode id.
    turns: std::collections::HashMap<u64, usize>,
}

impl TextEnv for Echo {
    fn name(&self) -> &str {
        "echo"
    }

    fn reset(&mut self, starts: &[EpisodeStart]) -> Result<Vec<Opening>, PluginError> {
        Ok(starts
            .iter()
            .map(|s| Opening {
                messages: vec![Message::new("user", s.prompt.clone())],
                tools: Vec::new(),
                images: Vec::new(),
            })
            .collect())
    }

    fn step(&mut self, turns: &[Turn]) -> Result<Vec<Reply>, PluginError> {
        Ok(turns
            .iter()
            .map(|t| {
                let seen = self.turns.entry(t.id).or_insert(0);
                *seen += 1;
                let done = *seen == 3;
                Reply {
                    messages: vec![Message::new(
                        "user",
                        format!("That was {} characters; again.", t.content.len()),
                    )],
                    images: Vec::new(),
                    reward: Some((t.content.len() % 2) as f64),
                    components: vec![("parity".into(), (t.content.len() % 2) as f64)],
                    done,
                    // The parity of the turn so far: GiGPO's later turns compare within it.
                    state_key: Some(format!("{}:{}", *seen, t.content.len() % 2)),
                }
            })
            .collect())
    }

    fn close(&mut self, _: &[u64]) {}
}

/// Episodes of three turns with the [`Echo`] environment.
fn echo_agent() -> Agent {
    Agent {
        tools: Vec::new(),
        env: Some(Box::new(Echo::default())),
        max_turns: 5,
        max_tokens: 400,
        system_prompt: None,
        images: None,
    }
}

/// Multi-turn episodes train on the model's tokens only: on the first update the policy is
/// the one that sampled, so every ratio the loss sees is 1 and nothing is clipped. Were the
/// environment's tokens in the loss, their stored log-probabilities (0) would give ratios far
/// below 1 − ε and a clip fraction above 0.
#[test]
fn multi_turn_episodes_train_only_on_the_models_tokens() {
    let mut agent = echo_agent();
    let trace = run_with(grpo(1), sampler(4), &PROMPTS, alternating, Some(&mut agent), None);
    assert_eq!(
        trace.value(1, "episode/turns"),
        3.0,
        "the environment ends every episode after 3 turns"
    );
    assert!(trace.value(1, "episode/env_token_share") > 0.3);
    assert_eq!(trace.value(1, "episode/truncated_frac"), 0.0);
    assert_eq!(
        trace.value(1, "train/clip_frac"),
        0.0,
        "only sampled tokens are in the loss"
    );
    assert!(trace.moved());
    assert!(trace.records[0].contains_key("train/reward/env/parity"));
}

/// GiGPO reaches the loss: with ω = 0 it is episode-level GRPO (the same update as
/// `advantage = "group"`), and with ω = 1 its step-level advantages change the update.
#[test]
fn gigpo_step_advantages_reach_the_loss() {
    let play = |advantage: AdvantageKind, step_advantage_weight: f32| {
        let mut agent = echo_agent();
        let grpo = GrpoSection {
            advantage,
            step_advantage_weight,
            ..grpo(1)
        };
        run_with(grpo, sampler(4), &PROMPTS, alternating, Some(&mut agent), None)
    };
    let group = play(AdvantageKind::Group, 1.0);
    let episode_level = play(AdvantageKind::Gigpo, 0.0);
    let with_steps = play(AdvantageKind::Gigpo, 1.0);
    let distance = |a: &Trace, b: &Trace| {
        (a.after.iter().zip(&b.after))
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max)
    };
    assert!(group.moved() && with_steps.moved());
    assert!(
        distance(&group, &episode_level) < 1e-6,
        "ω = 0 is GRPO: {}",
        distance(&group, &episode_level)
    );
    assert!(
        distance(&group, &with_steps) > 1e-4,
        "ω = 1 changes the update: {}",
        distance(&group, &with_steps)
    );
    assert_eq!(with_steps.value(1, "train/clip_frac"), 0.0);
}

/// A UCB curriculum over the prompts' sources (their first word, DUMP's settings): the easy and
/// hard sources' groups have no reward variance, so no advantage, and once each has been tried
/// the mixed source takes most draws (the others' exploration bonus grows while they wait, so
/// they are tried again now and then); without a curriculum it gets about a third.
#[test]
fn a_ucb_curriculum_draws_the_source_with_the_largest_advantages() {
    let prompts = BY_DIFFICULTY;
    let ucb = CurriculumSection {
        kind: rein_recipe::CurriculumKind::Ucb,
        ..CurriculumSection::default()
    };
    let mixed_share = |trace: &Trace, steps: std::ops::Range<usize>| {
        let drawn: Vec<String> = (trace.records[steps].iter())
            .flat_map(|r| r["samples"].as_array().unwrap().iter())
            .map(|s| s["prompt"].as_str().unwrap().to_string())
            .collect();
        drawn.iter().filter(|p| p.starts_with("mixed")).count() as f64 / drawn.len() as f64
    };
    let trace = run_with(grpo(24), sampler(2), &prompts, by_difficulty, None, Some(&ucb));
    assert!(mixed_share(&trace, 12..24) >= 0.85, "{}", mixed_share(&trace, 12..24));
    let last = trace.records.last().unwrap();
    let value = |key: &str| last[key].as_f64().unwrap_or_else(|| panic!("no {key} in {last:?}"));
    assert_eq!(value("train/curriculum/easy/abs_advantage"), 0.0);
    assert_eq!(value("train/curriculum/hard/abs_advantage"), 0.0);
    // Rewards 0, 1, 0, 1: |A| = 0.5 / (s + 1e-4) with s = √(1/3), the group's sample deviation.
    let expected = 0.5 / ((1.0f64 / 3.0).sqrt() + 1e-4);
    assert!((value("train/curriculum/mixed/abs_advantage") - expected).abs() < 1e-6);
    let weights = ["easy", "hard", "mixed"].map(|s| value(&format!("train/curriculum/{s}/weight")));
    assert!(
        (weights.iter().sum::<f64>() - 1.0).abs() < 1e-9 && weights[2] > 0.9,
        "{weights:?}"
    );
    let plain = run_with(grpo(16), sampler(2), &prompts, by_difficulty, None, None);
    assert!(mixed_share(&plain, 0..16) < 0.5, "{}", mixed_share(&plain, 0..16));
}

/// `sampler.precision = "q8"` samples through products whose activations are quantised to 8
/// bits (a GGUF model's packed weights): the trainer's exact log-probabilities then differ from
/// the sampler's, and `train/mismatch_kl` measures it. Exact sampling gives the trainer's own.
#[test]
fn q8_sampling_shows_in_the_mismatch_and_exact_sampling_does_not() {
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/gguf/tiny-llama.gguf");
    let mismatch = |precision| {
        let sampler = SamplerSection {
            precision,
            ..sampler(6)
        };
        run_model(&gguf, grpo(1), sampler, &PROMPTS, alternating, None, None).value(1, "train/mismatch_kl")
    };
    let (exact, q8) = (mismatch(SamplerPrecision::Exact), mismatch(SamplerPrecision::Q8));
    eprintln!("mismatch_kl: exact {exact:e}, q8 {q8:e}");
    assert!(exact < 1e-9, "exact sampling: {exact}");
    assert!(q8 > 1e-7 && q8 < 1e-2, "q8 sampling: {q8}");
}

/// Two steps of each completion: its halves, scored by its length and by its first character.
fn halves(completion: &str) -> Vec<StepScore> {
    let chars: Vec<char> = completion.chars().collect();
    let (n, half) = (chars.len(), chars.len() / 2);
    if half == 0 {
        return Vec::new();
    }
    let score = |start, end, score| StepScore { start, end, score };
    vec![
        score(0, half, (n % 3) as f64),
        score(half, n, f64::from(u32::from(chars[0]) % 2)),
    ]
}

/// Steps on the tiny Qwen2 whose outcome is the same for every completion, so that only step
/// scores (from each completion's text) or an implicit PRM can move the policy.
fn constant_outcome(
    grpo: GrpoSection,
    steps: Option<fn(&str) -> Vec<StepScore>>,
    implicit_prm: Option<ImplicitPrmSection>,
) -> Trace {
    let qwen2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lm/qwen2-gqa");
    Run {
        grpo,
        sampler: sampler(6),
        prompts: &PROMPTS,
        reward: constant,
        agent: None,
        curriculum: None,
        devices: 1,
        lora: None,
        signals: &[],
        steps,
        implicit_prm,
        tree: None,
    }
    .trace(&qwen2)
}

#[test]
fn step_scores_move_the_policy_only_through_the_process_advantage() {
    let trace = |grpo: GrpoSection, steps: Option<fn(&str) -> Vec<StepScore>>| constant_outcome(grpo, steps, None);
    let process = |gamma, step_weight| GrpoSection {
        advantage: AdvantageKind::Process,
        process_gamma: Some(gamma),
        process_step_weight: Some(step_weight),
        ..grpo(1)
    };
    assert!(
        !trace(grpo(1), Some(halves)).moved(),
        "the group advantage reads no step"
    );
    assert!(
        !trace(process(1.0, 1.0), None).moved(),
        "a constant outcome and no step teach nothing"
    );
    assert!(
        !trace(process(1.0, 0.0), Some(halves)).moved(),
        "step scores at weight 0 teach nothing"
    );
    let whole = trace(process(1.0, 1.0), Some(halves));
    assert!(whole.moved());
    assert!(
        whole.value(1, "train/step_scores") > 1.0,
        "most completions have two halves"
    );
    let discounted = trace(process(0.5, 1.0), Some(halves));
    assert!(discounted.moved());
    assert_ne!(
        whole.after, discounted.after,
        "γ discounts the later step for the earlier tokens"
    );
}

/// PRIME's implicit PRM: with a constant outcome only its token rewards can move the policy. It
/// starts equal to its reference, so every log-ratio is 0 until it has learned once: `after`
/// rewards the first step with the model before its update (nothing moves), `before` with the
/// model after it. Its weight, λ and the outcome in the last reward each change the update.
#[test]
fn the_implicit_prm_moves_the_policy_only_through_its_token_rewards() {
    let trace = |grpo: GrpoSection, prm: ImplicitPrmSection| constant_outcome(grpo, None, Some(prm));
    let process = GrpoSection {
        advantage: AdvantageKind::Process,
        ..grpo(1)
    };
    let prm = |update, weight, lambda, use_outcome| ImplicitPrmSection {
        lr: 1e-2,
        update,
        weight,
        lambda,
        use_outcome,
        ..ImplicitPrmSection::default()
    };
    let after = trace(process.clone(), prm(ImplicitPrmUpdate::After, 1.0, 0.0, false));
    assert!(
        !after.moved(),
        "before its first update the implicit PRM is its reference"
    );
    assert!(after.value(1, "implicit_prm/loss") > 0.0, "it learned all the same");
    assert_eq!(after.value(1, "implicit_prm/raw_reward"), 0.0);
    let unweighted = trace(process.clone(), prm(ImplicitPrmUpdate::Before, 0.0, 0.0, false));
    assert!(!unweighted.moved(), "token rewards at weight 0 teach nothing");
    let before = trace(process.clone(), prm(ImplicitPrmUpdate::Before, 1.0, 0.0, false));
    assert!(before.moved(), "after one update its log-ratios reward the tokens");
    assert_ne!(before.value(1, "implicit_prm/raw_reward"), 0.0);
    let returns = trace(process.clone(), prm(ImplicitPrmUpdate::Before, 1.0, 0.5, false));
    assert_ne!(
        before.after, returns.after,
        "λ sums the later rewards into each token's"
    );
    let outcome = trace(process, prm(ImplicitPrmUpdate::Before, 1.0, 0.5, true));
    assert_ne!(
        returns.after, outcome.after,
        "the outcome replaces the last token's reward"
    );
}

/// A tree rollout's leaves: 2 trunks and one branch point with 2 branches, the completion's
/// index in its group (trunks first) deciding its reward: 0, 1, 0, 1.
fn tree_trace(step_weight: f32) -> Trace {
    let qwen2 = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/lm/qwen2-gqa");
    let tree = rein_recipe::RolloutSection {
        kind: rein_recipe::RolloutKind::Tree,
        trunks: 2,
        branch_points: 1,
        branches: 2,
        rounds: 1,
        rule: rein_recipe::BranchRule::Entropy,
        interval: 4,
        step_weight,
    };
    Run {
        grpo: grpo(1),
        sampler: sampler(6),
        prompts: &PROMPTS,
        reward: alternating,
        agent: None,
        curriculum: None,
        devices: 1,
        lora: None,
        signals: &[],
        steps: None,
        implicit_prm: None,
        tree: Some(tree),
    }
    .trace(&qwen2)
}

#[test]
fn a_trees_step_advantage_reaches_the_loss_and_its_branches_sample_fewer_tokens() {
    let (with_steps, leaves_only) = (tree_trace(1.0), tree_trace(0.0));
    // The same tree (same seeds) with and without the branch point's step credit: the two
    // branches did differently, so the credit changes the update.
    assert!(with_steps.moved() && leaves_only.moved());
    assert_ne!(with_steps.after, leaves_only.after, "rollout.step_weight was ignored");
    assert_eq!(with_steps.value(1, "rollout/fallback_branch_points"), 0.0);
    // The branches share their parent's tokens before the branch point: the step sampled fewer
    // tokens than its 4 leaves hold.
    let (sampled, mean_length) = (
        with_steps.value(1, "train/sampled_tokens"),
        with_steps.value(1, "train/completion_length"),
    );
    assert!(
        sampled < 2.0 * 4.0 * mean_length,
        "{sampled} sampled for leaves of mean length {mean_length}"
    );
}

//! Multi-turn decoding: a [`Session`] keeps each conversation's KV cache across turns, and what
//! it computes must equal encoding each whole transcript from scratch; so must the teacher-forced
//! scores of a transcript's tokens ([`prompt_logprobs`], `rein serve`'s `echo`).

#[path = "common/logits.rs"]
mod logits;
#[path = "common/tiny_lm.rs"]
mod tiny_lm;

use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData};
use logits::logits;
use rein_model::lm::CausalLm;
use rein_sampler::{
    AfterTurn, Decoding, GenerationConfig, Prefill, Session, generate_seeded, prompt_logprobs, top_logprobs,
};
use tiny_lm::{FAMILIES, VOCAB, tiny_family, tiny_model};

type B = Flex;

/// `log softmax(z / t)` of one row.
fn log_softmax(row: &[f32], t: f32) -> Vec<f64> {
    let scaled: Vec<f64> = row.iter().map(|&z| f64::from(z / t)).collect();
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let log_z = max + scaled.iter().map(|z| (z - max).exp()).sum::<f64>().ln();
    scaled.iter().map(|z| z - log_z).collect()
}

/// Whole-transcript logits of one sequence, `[len, vocab]`.
fn encoded(model: &CausalLm<B>, tokens: &[u32]) -> Vec<f32> {
    let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
    logits(
        model,
        Tensor::from_data(TensorData::new(ids, [1, tokens.len()]), &Default::default()),
        true,
    )
}

/// Three turns over 32 sequences (two decode shards on two cores), each turn ending at a stop
/// token or the limit, environment tokens of different lengths appended between turns, some
/// conversations ending early. Every sampled token's log-probability and every next-token
/// distribution after an append equal those of the whole transcript encoded at once (1e-4).
#[test]
fn kv_cache_reuse_across_turns_equals_re_encoding_the_transcript() {
    for seed in [1u64, 2] {
        let model = tiny_model(seed);
        let prompts: Vec<Vec<u32>> = (0..8u32)
            .map(|i| (0..2 + i % 5).map(|j| (i * 11 + j * 3) % VOCAB as u32).collect())
            .collect();
        let config = GenerationConfig {
            max_new_tokens: 7,
            temperature: 0.8,
            n: 4,
            stop_token_ids: vec![3, 5],
            seed,
            ..GenerationConfig::default()
        };
        let device = Default::default();
        let mut session = Session::start(&model, &prompts, &config, 0, &device);
        let mut transcripts: Vec<Vec<u32>> = (0..32).map(|i| prompts[i / 4].clone()).collect();
        let mut live: Vec<usize> = (0..32).collect();
        let mut checked = (0usize, 0usize);
        for turn in 0..3 {
            let outputs = session.turn(&live, AfterTurn::Keep, &mut |_, _| false);
            for (&seq, out) in live.iter().zip(&outputs) {
                let start = transcripts[seq].len();
                transcripts[seq].extend(&out.tokens);
                let full = encoded(&model, &transcripts[seq]);
                for (k, (&token, &logprob)) in out.tokens.iter().zip(&out.logprobs).enumerate() {
                    let row = &full[(start + k - 1) * VOCAB..(start + k) * VOCAB];
                    let expected = log_softmax(row, 0.8)[token as usize];
                    assert!(
                        (expected - f64::from(logprob)).abs() < 1e-4,
                        "seed {seed} turn {turn} seq {seq} token {k}: {logprob} vs {expected}"
                    );
                    checked.0 += 1;
                }
            }
            // Every third conversation ends after its first turn; the others get 1-4 tokens.
            let ending: Vec<usize> = live.iter().copied().filter(|&s| turn == 0 && s % 3 == 0).collect();
            session.end(&ending);
            live.retain(|s| !ending.contains(s));
            let additions: Vec<(usize, Vec<u32>)> = live
                .iter()
                .map(|&s| {
                    (
                        s,
                        (0..1 + (s + turn) % 4).map(|j| ((s * 7 + j) % VOCAB) as u32).collect(),
                    )
                })
                .collect();
            session.append(&additions);
            for (seq, added) in &additions {
                transcripts[*seq].extend(added);
                let full = encoded(&model, &transcripts[*seq]);
                let last = &full[full.len() - VOCAB..];
                let next = session.next_logits(*seq).expect("logits after an append");
                for (a, b) in last.iter().zip(next) {
                    assert!((a - b).abs() < 1e-4, "seed {seed} turn {turn} seq {seq}: {a} vs {b}");
                }
                checked.1 += 1;
            }
        }
        assert!(checked.0 > 200 && checked.1 > 40, "{checked:?}");
        assert!(!session.is_live(0) && session.is_live(1));
    }
}

/// A session's first turn with every sequence leaving as it finishes is exactly
/// single-turn generation.
#[test]
fn one_turn_of_a_session_is_generation() {
    let model = tiny_model(4);
    let prompts = vec![vec![1, 2, 3], vec![4], vec![7, 8]];
    let config = GenerationConfig {
        max_new_tokens: 9,
        temperature: 1.0,
        n: 3,
        stop_token_ids: vec![3],
        seed: 9,
        ..GenerationConfig::default()
    };
    let device = Default::default();
    let generated = rein_sampler::generate(&model, &prompts, &config, 0, &mut |_, _| false, &device);
    let mut session = Session::start(&model, &prompts, &config, 0, &device);
    let turns = session.turn(&(0..9).collect::<Vec<_>>(), AfterTurn::Keep, &mut |_, _| false);
    for (g, t) in generated.iter().zip(&turns) {
        assert_eq!(g.tokens, t.tokens);
        assert_eq!(g.finish, t.finish);
        for (a, b) in g.logprobs.iter().zip(&t.logprobs) {
            assert!((a - b).abs() < 1e-5);
        }
    }
}

/// Sequences that share a prompt start from one prefill of it ([`Prefill::of_streams`], what
/// multi-turn episodes do for a group's alike openings): each samples, turn after turn, exactly
/// what it samples when its prompt is prefilled for it alone — tokens and log-probabilities, bit
/// for bit — over two turns with an append between them.
#[test]
fn sequences_sharing_a_prompts_prefill_sample_what_they_would_alone() {
    let model = tiny_model(6);
    let prompts = [vec![1, 2, 3, 4], vec![5], vec![7, 8, 9]];
    let rows = [0, 0, 1, 0, 2, 2, 1, 0];
    let config = GenerationConfig {
        max_new_tokens: 6,
        temperature: 1.0,
        stop_token_ids: vec![3],
        seed: 5,
        ..GenerationConfig::default()
    };
    let device = Default::default();
    let streams: Vec<(usize, u64, usize)> = (rows.iter().enumerate())
        .map(|(s, &p)| (p, rein_sampler::prompt_seed(config.seed, s), 0))
        .collect();
    let all: Vec<usize> = (0..rows.len()).collect();
    let two_turns = |mut session: Session<'_, B>| {
        let first = session.turn(&all, AfterTurn::Keep, &mut |_, _| false);
        let added: Vec<(usize, Vec<u32>)> = all.iter().map(|&s| (s, vec![10 + s as u32; s % 3 + 1])).collect();
        session.append(&added);
        [first, session.turn(&all, AfterTurn::Keep, &mut |_, _| false)]
    };
    let shared =
        two_turns(Prefill::of_streams(&model, &prompts, &streams, &config, 0, usize::MAX, &device).into_session());
    let each: Vec<Vec<u32>> = rows.iter().map(|&p| prompts[p].clone()).collect();
    let alone = two_turns(Session::start(&model, &each, &config, 0, &device));
    assert_eq!(shared, alone);
}

/// Generation decoded a few steps at a time ([`Decoding`], what `rein serve` runs to share
/// itself between requests) draws exactly what one call draws: tokens, log-probabilities, top
/// alternatives and finish reasons, bit for bit, for slices of 1, 2 and 5 steps, with a stop
/// condition that ends some sequences early.
#[test]
fn generation_in_slices_is_generation_in_one_call() {
    let model = tiny_model(6);
    let prompts = vec![vec![1, 2, 3], vec![4], vec![7, 8, 9, 10]];
    let seeds = [11, 12, 13];
    let config = GenerationConfig {
        max_new_tokens: 12,
        temperature: 0.9,
        top_logprobs: 2,
        n: 2,
        stop_token_ids: vec![3],
        ..GenerationConfig::default()
    };
    let device = Default::default();
    let mut stop = |seq: usize, tokens: &[u32]| seq % 3 == 1 && tokens.len() == 4;
    let whole = generate_seeded(&model, &prompts, &seeds, &config, 0, &mut stop, &device);
    let longest = whole.iter().map(|g| g.tokens.len()).max().unwrap_or(0);
    for slice in [1, 2, 5] {
        let mut decoding = Decoding::in_chunks(&model, &prompts, &seeds, &config, 0, usize::MAX, &device);
        let mut slices = 1;
        while !decoding.advance(slice, &mut stop) {
            slices += 1;
        }
        assert!(slices >= longest.div_ceil(slice), "{slices} slices of {slice} steps");
        assert_eq!(decoding.into_generations(), whole, "slices of {slice} steps");
    }
    let lengths: Vec<_> = whole.iter().map(|g| g.tokens.len()).collect();
    assert!(
        lengths.contains(&4) && lengths.contains(&12),
        "no sequence ended early, or none ran to the limit: {lengths:?}"
    );
}

/// A prefill in chunks of columns ([`Prefill`], `rein serve`'s for long prompts) gives every
/// sequence the next-token logits of the one-pass prefill (1e-4) and the same routing, for
/// each family's shapes (Gemma 3's sliding window of 2 keys across chunk boundaries, a
/// mixture of experts' routes), prompts of different lengths (the short ones' first chunks all
/// padding) and chunks of 1, 2 and 4 columns; then the same greedy tokens.
#[test]
fn a_prefill_in_chunks_is_the_prefill_in_one_pass() {
    let prompts = vec![vec![1, 2, 3, 4, 5, 6, 7, 8, 9], vec![4, 5], vec![7, 8, 9, 10, 11, 12]];
    let seeds = [1, 2, 3];
    let config = GenerationConfig {
        max_new_tokens: 6,
        temperature: 0.0,
        n: 2,
        ..GenerationConfig::default()
    };
    let device = Default::default();
    for family in FAMILIES {
        let model = tiny_family(family, 3);
        let whole = Session::start_seeded(&model, &prompts, &seeds, &config, 0, &device);
        let greedy = generate_seeded(&model, &prompts, &seeds, &config, 0, &mut |_, _| false, &device);
        assert!(greedy.iter().all(|g| g.tokens.len() == 6));
        for chunk in [1, 2, 4] {
            let chunked = Prefill::new(&model, &prompts, &seeds, &config, 0, chunk, &device).into_session();
            for seq in 0..whole.len() {
                let (a, b) = (whole.next_logits(seq).unwrap(), chunked.next_logits(seq).unwrap());
                let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
                assert!(worst < 1e-4, "{family}, chunks of {chunk}, sequence {seq}: {worst}");
                assert_eq!(whole.routes(seq), chunked.routes(seq), "{family}, chunks of {chunk}");
            }
            let mut decoding = Decoding::in_chunks(&model, &prompts, &seeds, &config, 0, chunk, &device);
            let mut steps = 0;
            while !decoding.advance(1, &mut |_, _| false) {
                steps += 1;
            }
            assert!(
                steps >= 9usize.div_ceil(chunk),
                "{family}: the prefill took {steps} steps"
            );
            let tokens = |g: &[rein_sampler::Generation]| g.iter().map(|g| g.tokens.clone()).collect::<Vec<_>>();
            assert_eq!(
                tokens(&decoding.into_generations()),
                tokens(&greedy),
                "{family}, chunks of {chunk}"
            );
        }
    }
}

/// Scoring a transcript (a prompt and its sampled continuation, as `echo` does) gives each
/// token the log-probability of the whole transcript's encoding, the sampler's own for the
/// sampled tokens, and the same top alternatives the sampler recorded (1e-4), at temperatures 0
/// and 0.8.
#[test]
fn scoring_a_transcript_gives_what_the_sampler_gave() {
    let model = tiny_model(5);
    let device = Default::default();
    let prompts = vec![vec![1u32, 9, 4, 22], vec![7u32]];
    for temperature in [0.0f32, 0.8] {
        let config = GenerationConfig {
            max_new_tokens: 8,
            temperature,
            n: 2,
            seed: 11,
            top_logprobs: 5,
            ..GenerationConfig::default()
        };
        let generated = rein_sampler::generate(&model, &prompts, &config, 0, &mut |_, _| false, &device);
        for g in &generated {
            let prompt = &prompts[g.prompt];
            let transcript: Vec<u32> = prompt.iter().chain(&g.tokens).copied().collect();
            let scored = prompt_logprobs(&model, &transcript, temperature, 5, &device);
            assert_eq!(scored.len(), transcript.len() - 1);
            let t = if temperature > 0.0 { temperature } else { 1.0 };
            let encoding = encoded(&model, &transcript);
            for (i, s) in scored.iter().enumerate() {
                let row = &encoding[i * VOCAB..(i + 1) * VOCAB];
                let expected = log_softmax(row, t)[transcript[i + 1] as usize];
                assert!(
                    (f64::from(s.logprob) - expected).abs() < 1e-4,
                    "{i}: {} vs {expected}",
                    s.logprob
                );
                assert_eq!(s.top.len(), 5);
                assert_eq!(s.top.iter().map(|x| x.0).collect::<Vec<_>>(), top_ids(row, temperature));
            }
            assert_eq!(g.top_logprobs.len(), g.tokens.len());
            for (j, (&logprob, top)) in g.logprobs.iter().zip(&g.top_logprobs).enumerate() {
                let s = &scored[prompt.len() - 1 + j];
                assert!((s.logprob - logprob).abs() < 1e-4);
                for (a, b) in s.top.iter().zip(top) {
                    assert_eq!(a.0, b.0);
                    assert!((a.1 - b.1).abs() < 1e-4);
                }
                if temperature == 0.0 {
                    assert_eq!(top[0], (g.tokens[j], logprob), "greedy takes the most likely token");
                }
            }
        }
    }
    assert!(prompt_logprobs(&model, &[5], 1.0, 3, &device).is_empty());
}

/// The five most likely ids of a row.
fn top_ids(row: &[f32], temperature: f32) -> Vec<u32> {
    top_logprobs(row, temperature, 5)
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

/// The loss of a multi-turn batch sends no gradient to the tokens the environment added: the
/// gradient with respect to every environment position's log-probability is exactly 0, and
/// every sampled position's is not. `keep_in_loss` is what GRPO applies to each episode.
#[test]
fn environment_tokens_get_no_gradient() {
    use burn::backend::Autodiff;
    use rein_optim::{PolicyLossConfig, policy_loss};
    use rein_posttrain::TokenBatch;
    type A = Autodiff<Flex>;
    let device = Default::default();
    // Two episodes: sampled (s) and environment (e) tokens after a prompt.
    //   row 0: s s e e e s s
    //   row 1: s e e s
    let trained = [
        vec![true, true, false, false, false, true, true],
        vec![true, false, false, true],
    ];
    let completions: Vec<Vec<u32>> = trained.iter().map(|t| (0..t.len() as u32).collect()).collect();
    let pairs: Vec<(&[u32], &[u32])> = completions.iter().map(|c| (&[1u32, 2][..], c.as_slice())).collect();
    let mut batch = TokenBatch::new(&pairs, 0);
    for (row, kept) in trained.iter().enumerate() {
        batch.keep_in_loss(row, kept);
    }
    let [rows, width] = [batch.rows, batch.completion_width];
    let values: Vec<f32> = (0..rows * width).map(|i| -0.5 - 0.1 * i as f32).collect();
    let log_prob = Tensor::<A, 2>::from_data(TensorData::new(values.clone(), [rows, width]), &device).require_grad();
    let old = Tensor::<A, 2>::from_data(TensorData::new(values, [rows, width]), &device);
    let advantages = Tensor::<A, 2>::from_data(TensorData::new(vec![1.0f32, -1.0], [rows, 1]), &device);
    for aggregation in [
        rein_core::Aggregation::TokenMean,
        rein_core::Aggregation::SeqMeanTokenMean,
        rein_core::Aggregation::SeqMeanTokenSumNorm,
    ] {
        let config = PolicyLossConfig {
            level: rein_core::RatioLevel::Token,
            objective: rein_optim::PolicyObjective::Clip,
            clip_low: 0.2,
            clip_high: 0.28,
            dual_clip: None,
            aggregation,
            max_completion_len: width,
            kl_coef: 0.0,
            kl_estimator: rein_core::KlEstimator::K3,
            kl_importance_weighted: true,
            entropy_coef: 0.0,
            top_entropy_quantile: 1.0,
        };
        let out = policy_loss(
            log_prob.clone(),
            old.clone(),
            advantages.clone(),
            batch.mask::<A>(&device),
            None,
            None,
            &config,
        );
        let grads = out.loss.backward();
        let grad: Vec<f32> = log_prob.grad(&grads).unwrap().into_data().to_vec().unwrap();
        for (row, kept) in trained.iter().enumerate() {
            for (t, &sampled) in kept.iter().enumerate() {
                let g = grad[row * width + t];
                match sampled {
                    true => assert!(g != 0.0, "{aggregation:?}: sampled token {row},{t} has no gradient"),
                    false => assert_eq!(g, 0.0, "{aggregation:?}: environment token {row},{t} has gradient {g}"),
                }
            }
        }
    }
}

//! The generator's invariants: the KV cache equals recomputation, left padding and batching
//! change nothing, windows bound the cache, stops, lengths and seeds are honoured.

use super::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn kv_cache_decoding_equals_full_recomputation(
        seqs in prop::collection::vec(prop::collection::vec(0u32..40, 1..6), 1..4),
        extra in prop::collection::vec(0u32..40, 1..6),
        seed in 0u64..50,
        family in prop::sample::select(FAMILIES.to_vec()),
    ) {
        // Every row gets the same length so no padding is needed; decode `extra` one at a time
        // (past Gemma's window of 2: its sliding layers drop keys from their cache).
        let m = tiny_family(family, seed);
        let dev = Default::default();
        let len = seqs.iter().map(Vec::len).min().unwrap();
        let batch = seqs.len();
        let prefix: Vec<i64> = seqs.iter().flat_map(|s| s[..len].iter().map(|&t| i64::from(t))).collect();
        let total = len + extra.len();
        let rope = m.rope(total, &dev);
        let mut cache = KvCache::new(m.config(), batch, total, &dev);
        let positions = |start: usize, n: usize| Tensor::<B, 1, Int>::arange(start as i64..(start + n) as i64, &dev).unsqueeze::<2>().expand([batch, n]);
        let ctx = Context { rope: &rope, positions: positions(0, len), padding: None, sequences: None, fused: None, routing: None };
        let mut cached = m.forward(Tensor::from_data(TensorData::new(prefix.clone(), [batch, len]), &dev), &ctx, Some(&mut cache));
        let mut all = prefix.clone();
        let mut width = len;
        for &t in &extra {
            let next: Vec<i64> = vec![i64::from(t); batch];
            let ctx = Context { rope: &rope, positions: positions(width, 1), padding: None, sequences: None, fused: None, routing: None };
            cached = m.forward(Tensor::from_data(TensorData::new(next, [batch, 1]), &dev), &ctx, Some(&mut cache));
            let mut grown = Vec::with_capacity(batch * (width + 1));
            for b in 0..batch {
                grown.extend_from_slice(&all[b * width..(b + 1) * width]);
                grown.push(i64::from(t));
            }
            all = grown;
            width += 1;
        }
        let full = logits(&m, Tensor::from_data(TensorData::new(all, [batch, width]), &dev), false);
        let last: Vec<f32> = cached.into_data().to_vec().unwrap();
        let vocab = 40;
        for b in 0..batch {
            for v in 0..vocab {
                let f = full[(b * width + width - 1) * vocab + v];
                prop_assert!((f - last[b * vocab + v]).abs() < 1e-4, "row {b}: {f} vs {}", last[b * vocab + v]);
            }
        }
    }

    #[test]
    fn batching_with_left_padding_changes_nothing(
        prompts in prop::collection::vec(prop::collection::vec(0u32..40, 1..7), 1..4),
        seed in 0u64..50,
        temperature in prop::sample::select(vec![0.0f32, 0.9]),
        family in prop::sample::select(FAMILIES.to_vec()),
    ) {
        let m = tiny_family(family, seed);
        let config = GenerationConfig { max_new_tokens: 6, temperature, n: 2, seed: 7, ..GenerationConfig::default() };
        // Each sequence draws from the stream of its (prompt index, sample index), so it is
        // compared with a batch holding the same prompts up to it: the padding and the other rows
        // (shorter, longer, or none) must not change it.
        let together = generate(&m, &prompts, &config, 0, &mut |_, _| false, &Default::default());
        for p in 0..prompts.len() {
            let fewer = generate(&m, &prompts[..=p], &config, 0, &mut |_, _| false, &Default::default());
            if temperature == 0.0 {
                let alone = generate(&m, std::slice::from_ref(&prompts[p]), &config, 0, &mut |_, _| false, &Default::default());
                prop_assert_eq!(&together[p * 2].tokens, &alone[0].tokens, "greedy, prompt {}", p);
            }
            for s in 0..2 {
                let (a, b) = (&together[p * 2 + s], &fewer[p * 2 + s]);
                prop_assert_eq!(&a.tokens, &b.tokens, "prompt {}, sample {}", p, s);
                for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                    prop_assert!((x - y).abs() < 1e-4);
                }
            }
        }
    }
}

/// A sliding-window layer's cache holds about two windows of keys however long the generation,
/// while a global layer's holds every position; decoding past the window still equals the
/// full recomputation (the proptest above), and the dropped keys were never needed.
#[test]
fn a_window_layers_cache_stays_within_two_windows() {
    let m = tiny_family("gemma3", 3);
    let dev = Default::default();
    let total = 48;
    let rope = m.rope(total, &dev);
    let mut cache = KvCache::new(m.config(), 2, total, &dev);
    let positions = |start: usize, n: usize| {
        Tensor::<B, 1, Int>::arange(start as i64..(start + n) as i64, &dev)
            .unsqueeze::<2>()
            .expand([2, n])
    };
    let feed = |cache: &mut KvCache<B>, start: usize, tokens: Vec<i64>| {
        let n = tokens.len() / 2;
        let ctx = Context {
            rope: &rope,
            positions: positions(start, n),
            padding: None,
            sequences: None,
            fused: None,
            routing: None,
        };
        m.forward(
            Tensor::from_data(TensorData::new(tokens, [2, n]), &dev),
            &ctx,
            Some(cache),
        );
    };
    feed(&mut cache, 0, vec![1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    for t in 5..total {
        feed(&mut cache, t, vec![(t % 40) as i64, ((t * 7) % 40) as i64]);
        for (i, layer) in cache.layers().iter().enumerate() {
            let window = m.config().layer_attention()[i].window();
            match window {
                Some(w) => assert!(
                    layer.buffer_positions() <= (2 * w).max(5),
                    "layer {i} holds {} positions",
                    layer.buffer_positions()
                ),
                None => assert!(layer.buffer_positions() > t, "the global layer keeps every position"),
            }
        }
    }
    assert!(cache.layers()[0].dropped() > 0, "the sliding layer dropped keys");
}

/// Large batches are split into shards decoded in parallel (one per core, from 16 rows each),
/// and sequences finish at different steps: neither may change any sequence.
#[test]
fn sharded_decoding_with_early_stops_matches_small_batches() {
    let m = tiny_model(5);
    let prompts: Vec<Vec<u32>> = (0..12u32)
        .map(|i| (0..1 + i % 5).map(|j| (i * 7 + j) % 40).collect())
        .collect();
    let config = GenerationConfig {
        max_new_tokens: 10,
        temperature: 0.9,
        n: 4,
        stop_token_ids: vec![3],
        seed: 5,
        ..GenerationConfig::default()
    };
    let device = Default::default();
    let together = generate(&m, &prompts, &config, 0, &mut |_, _| false, &device);
    assert!(
        together.iter().any(|g| g.tokens.len() < 10),
        "some sequences stop early"
    );
    for (p, prompt) in prompts.iter().enumerate() {
        // Alone, prompt `p` would draw from prompt 0's streams: compare with the batch up to it.
        let fewer = generate(&m, &prompts[..=p], &config, 0, &mut |_, _| false, &device);
        for s in 0..4 {
            let (a, b) = (&together[p * 4 + s], &fewer[p * 4 + s]);
            assert_eq!(a.tokens, b.tokens, "prompt {p} {prompt:?}, sample {s}");
            for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                assert!((x - y).abs() < 1e-4, "prompt {p}, sample {s}: {x} vs {y}");
            }
        }
    }
}

#[test]
fn generation_respects_stops_lengths_and_seeds() {
    let m = tiny_model(3);
    let prompts = vec![vec![1, 2, 3], vec![4]];
    let config = GenerationConfig {
        max_new_tokens: 12,
        temperature: 1.0,
        n: 3,
        seed: 11,
        ..GenerationConfig::default()
    };
    let a = generate(&m, &prompts, &config, 0, &mut |_, _| false, &Default::default());
    let b = generate(&m, &prompts, &config, 0, &mut |_, _| false, &Default::default());
    assert_eq!(a, b, "same seed, same samples");
    assert_eq!(a.len(), 6);
    assert!(
        a.iter()
            .all(|g| g.tokens.len() == 12 && g.finish == rein_sampler::FinishReason::Length)
    );
    let other = generate(
        &m,
        &prompts,
        &GenerationConfig {
            seed: 12,
            ..config.clone()
        },
        0,
        &mut |_, _| false,
        &Default::default(),
    );
    assert_ne!(a, other);
    // A stop token ends the sequence on it; a stop condition ends it where it matches.
    let stop_token = a[0].tokens[4];
    let stopped = generate(
        &m,
        &prompts,
        &GenerationConfig {
            stop_token_ids: vec![stop_token],
            ..config.clone()
        },
        0,
        &mut |_, _| false,
        &Default::default(),
    );
    let first = a[0].tokens.iter().position(|&t| t == stop_token).unwrap();
    assert_eq!(stopped[0].tokens, a[0].tokens[..=first].to_vec());
    assert_eq!(stopped[0].finish, rein_sampler::FinishReason::StopToken);
    let cut = generate(
        &m,
        &prompts,
        &config,
        0,
        &mut |seq, tokens| seq == 1 && tokens.len() == 5,
        &Default::default(),
    );
    assert_eq!(cut[1].tokens.len(), 5);
    assert_eq!(cut[1].finish, rein_sampler::FinishReason::StopCondition);
    assert_eq!(cut[0], a[0], "other sequences are unaffected");
}

/// Dropping every sequence from a cache leaves empty buffers of the same layout (no gather over
/// an empty index, which fails to launch on burn-cuda), and the cache can still grow after.
#[test]
fn a_cache_emptied_of_every_sequence_keeps_its_layout() {
    let m = tiny_model(1);
    let mut cache = KvCache::<B>::new(m.config(), 3, 8, &Default::default());
    cache.retain(&[2, 0]);
    assert_eq!(cache.batch(), 2);
    cache.retain(&[]);
    assert_eq!((cache.batch(), cache.capacity()), (0, 8));
    cache.reserve(16);
    assert!(cache.capacity() >= 16);
}

/// `token_certainty.json` (by `tests/fixtures/gen_token_certainty.py`): the tiny Qwen2's greedy
/// continuation with its logits, and PyTorch's self-certainty and entropy of every step at two
/// temperatures.
#[derive(serde::Deserialize)]
struct CertaintyFixture {
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    temperatures: std::collections::BTreeMap<String, CertaintyValues>,
}

#[derive(serde::Deserialize)]
struct CertaintyValues {
    self_certainty: Vec<f64>,
    entropy: Vec<f64>,
}

/// What the sampler records of each token it draws — Intuitor's self-certainty and RENT's
/// entropy — equals PyTorch's formulas on transformers' logits: along the greedy continuation
/// (within 1e-4, the logits' own agreement), and on the same logits at temperature 0.7 (within
/// 1e-5); asking for it changes no token or log-probability.
#[test]
fn the_samplers_certainty_matches_pytorchs_on_transformers_logits() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/token_certainty.json");
    let fixture: CertaintyFixture = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let m = model("qwen2-gqa");
    let prompts = [fixture.prompt.clone()];
    let config = |certainty| GenerationConfig {
        max_new_tokens: fixture.tokens.len(),
        temperature: 0.0,
        certainty,
        ..GenerationConfig::default()
    };
    let generate = |certainty| {
        generate(
            &m,
            &prompts,
            &config(certainty),
            0,
            &mut |_, _| false,
            &Default::default(),
        )
    };
    let (with, without) = (generate(true).remove(0), generate(false).remove(0));
    assert_eq!(with.tokens, fixture.tokens);
    assert_eq!((&with.tokens, &with.logprobs), (&without.tokens, &without.logprobs));
    assert!(without.certainty.is_empty());
    let greedy = &fixture.temperatures["1.0"];
    assert_eq!(with.certainty.len(), fixture.tokens.len());
    for (i, c) in with.certainty.iter().enumerate() {
        assert!(
            (f64::from(c.self_certainty) - greedy.self_certainty[i]).abs() < 1e-4,
            "step {i}: {c:?}"
        );
        assert!(
            (f64::from(c.entropy) - greedy.entropy[i]).abs() < 1e-4,
            "step {i}: {c:?}"
        );
    }
    let warm = &fixture.temperatures["0.7"];
    for (i, row) in fixture.logits.iter().enumerate() {
        let c = rein_sampler::token_certainty(row, 0.7);
        assert!(
            (f64::from(c.self_certainty) - warm.self_certainty[i]).abs() < 1e-5,
            "step {i}: {c:?}"
        );
        assert!((f64::from(c.entropy) - warm.entropy[i]).abs() < 1e-5, "step {i}: {c:?}");
    }
}

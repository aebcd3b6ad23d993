//! Conversations decoded turn by turn, each keeping its key/value cache between turns.
//!
//! A [`Session`] prefills a batch of prompts once (left-padded; each prompt's `n` samples — or
//! whichever sequences start from it, [`Prefill::of_streams`] — copy its cache rows; in one
//! pass, or a chunk of positions at a time through [`Prefill`]), then alternates:
//! - [`Session::turn`]: every live sequence asked for samples tokens until a stop token, the
//!   caller's stop check or the turn's token limit. All of them decode together, one token per
//!   step; a sequence whose turn has ended is fed a masked padding slot until the others end
//!   theirs, so it keeps its cache row.
//! - [`Session::append`]: the tokens the environment adds after a turn (a tool result, the next
//!   turn's header) are prefilled after each sequence's cached tokens, batched; the prefix is
//!   never encoded again. [`Session::append_with_images`] shows a vision-language model the
//!   images they hold (`session/shown_images.rs`).
//! - [`Session::begin_turn`] and [`Session::continue_turn`]: a turn decoded a few steps at a
//!   time (a server sharing itself between sessions); the same tokens as one `turn` call.
//! - [`Session::end`]: a finished conversation leaves the cache and stops costing compute.
//!
//! Positions count each sequence's real tokens only, so padding slots change nothing: a
//! sequence's logits are those of its whole transcript encoded at once (tests/multi_turn.rs
//! checks 1e-4). Large batches are split into shards decoded on their own threads, as in
//! [`crate::generate`]. Token choice is [`crate::choose`], from each sequence's own seeded
//! stream, continued across turns.
//!
//! A mixture-of-experts model's routing is recorded per sequence ([`Session::routes`]): the
//! experts every token it fed through the model went to, for the trainer to replay.

use burn::tensor::{Bool, Int, Tensor, TensorData};
use rein_kernels::team;
use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, Context, FusedProjections, KvCache, Rope, Routing};
use rein_model::vision::{ProcessedImage, with_image_features};

use crate::token_choice::{Choice, FinishReason, GenerationConfig, TokenCertainty, choose_with_extras};
use rein_core::SeededRng;

mod prefill;
mod shown_images;

pub use prefill::{Prefill, PromptImages, PromptPositions};
use shown_images::{FeedImages, ShownImages};

/// The tokens one sequence sampled in one turn.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutput {
    /// The sampled tokens, in order (a stop token is the last).
    pub tokens: Vec<u32>,
    /// Log-probability of each under `softmax(z / T)` (see [`crate::choose`]).
    pub logprobs: Vec<f32>,
    /// At each position, the `config.top_logprobs` most likely tokens and their log-probabilities
    /// under the same distribution (see [`crate::top_logprobs`]); empty when that is 0.
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// At each position, how sure the model was (see [`TokenCertainty`]); empty unless
    /// `config.certainty`.
    pub certainty: Vec<TokenCertainty>,
    /// Why the turn ended.
    pub finish: FinishReason,
}

/// A turn under way ([`Session::begin_turn`]): what each sequence has sampled so far.
pub struct Turn {
    /// In the order of the turn's sequences.
    outputs: Vec<TurnOutput>,
    /// Per sequence of the session, its index in `outputs` while its turn goes on.
    active: Vec<Option<usize>>,
    /// Steps decoded so far.
    step: usize,
}

impl Turn {
    /// Whether every sequence's turn has ended (`limit`: the session's `max_new_tokens`).
    fn is_over(&self, limit: usize) -> bool {
        self.step >= limit || self.active.iter().all(Option::is_none)
    }

    /// The tokens each sequence sampled, in the order the turn was begun with.
    pub fn into_outputs(self) -> Vec<TurnOutput> {
        self.outputs
    }
}

/// What happens to a sequence when its turn ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterTurn {
    /// It stays in the cache for the next turn.
    Keep,
    /// It leaves the cache at once (single-turn generation).
    End,
}

/// Where one sequence stands.
struct Sequence {
    /// Its shard, while it is in the cache.
    shard: Option<usize>,
    /// Position of its next token (its real tokens so far).
    position: i64,
    /// The logits of its next token, when they are current.
    logits: Vec<f32>,
    /// A sampled token not yet in the cache (the last token of an ended turn).
    pending: Option<u32>,
    rng: SeededRng,
    /// Per decoder layer, the experts each token fed so far went to (`tokens × k`; empty for
    /// dense layers and dense models).
    routes: Vec<Vec<u32>>,
}

/// A slice of the sequences with its own cache, decoded on its own thread.
struct Shard<B: ReinBackend> {
    /// The sequence of each cache row.
    rows: Vec<usize>,
    cache: KvCache<B>,
}

/// What one forward pass of a shard gives: the last column's logits, `[rows, vocab]`, and for a
/// mixture of experts the experts of every token (per layer, `rows × width × k`).
struct Fed {
    logits: Vec<f32>,
    routes: Option<Vec<Vec<u32>>>,
}

/// A feed on its way through a shard's cache, with the images it shows.
struct ShardRun<'a, B: ReinBackend> {
    cache: &'a mut KvCache<B>,
    feed: &'a Feed,
    images: Option<&'a FeedImages<B>>,
}

/// One forward pass of a shard: `[rows, width]` tokens, positions and padding flags.
struct Feed {
    tokens: Vec<i64>,
    positions: Vec<i64>,
    padding: Vec<bool>,
    width: usize,
}

/// A batch of conversations with their caches; see the module docs.
pub struct Session<'m, B: ReinBackend> {
    model: &'m CausalLm<B>,
    fused: FusedProjections<B>,
    rope: Rope<B>,
    config: GenerationConfig,
    pad_id: u32,
    vocab: usize,
    sequences: Vec<Sequence>,
    shards: Vec<Shard<B>>,
    device: B::Device,
}

impl<'m, B: ReinBackend> Session<'m, B> {
    /// Prefills `prompts` (each non-empty) and makes `config.n` sequences of each: sequence
    /// `prompt * n + sample`, drawing from the stream of ([`prompt_seed`]`(config.seed, prompt)`,
    /// sample). `config.max_new_tokens` is the token limit of each turn.
    pub fn start(
        model: &'m CausalLm<B>,
        prompts: &[Vec<u32>],
        config: &GenerationConfig,
        pad_id: u32,
        device: &B::Device,
    ) -> Self {
        let seeds: Vec<u64> = (0..prompts.len()).map(|p| prompt_seed(config.seed, p)).collect();
        Self::start_seeded(model, prompts, &seeds, config, pad_id, device)
    }

    /// [`Session::start`] with each prompt's own seed (`seeds[p]` in place of
    /// `prompt_seed(config.seed, p)`): prompts batched together from different requests draw
    /// what each would draw alone.
    pub fn start_seeded(
        model: &'m CausalLm<B>,
        prompts: &[Vec<u32>],
        seeds: &[u64],
        config: &GenerationConfig,
        pad_id: u32,
        device: &B::Device,
    ) -> Self {
        Prefill::new(model, prompts, seeds, config, pad_id, usize::MAX, device).into_session()
    }

    /// Sequences in the session (ended ones included).
    pub fn len(&self) -> usize {
        self.sequences.len()
    }

    /// Whether the session has no sequences.
    pub fn is_empty(&self) -> bool {
        self.sequences.is_empty()
    }

    /// Whether `seq` is still in the cache.
    pub fn is_live(&self, seq: usize) -> bool {
        self.sequences[seq].shard.is_some()
    }

    /// Per decoder layer, the experts each token of `seq` fed through the model so far went to
    /// (`tokens × k`, token-major: the prompt, then every token decoded or appended but the
    /// pending one); empty entries for dense layers, nothing for a dense model.
    pub fn routes(&self, seq: usize) -> &[Vec<u32>] {
        &self.sequences[seq].routes
    }

    /// The logits of `seq`'s next token, if it has not sampled since they were computed.
    pub fn next_logits(&self, seq: usize) -> Option<&[f32]> {
        let sequence = &self.sequences[seq];
        (sequence.pending.is_none() && !sequence.logits.is_empty()).then_some(sequence.logits.as_slice())
    }

    /// Samples one turn of each of `seqs` (live, with their next-token logits current), all
    /// decoded together, and returns their tokens in the order of `seqs`. `stop(seq, tokens)`
    /// may end a turn early (stop strings, a tool call's close tag). With [`AfterTurn::End`] a
    /// sequence leaves the cache as its turn ends.
    pub fn turn(
        &mut self,
        seqs: &[usize],
        after: AfterTurn,
        stop: &mut dyn FnMut(usize, &[u32]) -> bool,
    ) -> Vec<TurnOutput> {
        let mut turn = self.begin_turn(seqs);
        self.continue_turn(&mut turn, usize::MAX, after, stop);
        turn.into_outputs()
    }

    /// A turn of each of `seqs` (live, with their next-token logits current) that
    /// [`Session::continue_turn`] decodes a few steps at a time: [`Session::turn`] in slices,
    /// so a server can share itself out between sessions. The slices draw what one call draws.
    pub fn begin_turn(&self, seqs: &[usize]) -> Turn {
        let mut active: Vec<Option<usize>> = vec![None; self.sequences.len()];
        for (i, &seq) in seqs.iter().enumerate() {
            assert!(
                self.next_logits(seq).is_some() && self.is_live(seq),
                "sequence {seq} cannot start a turn: it has ended, or its last turn was not followed by append"
            );
            active[seq] = Some(i);
        }
        Turn {
            outputs: seqs
                .iter()
                .map(|_| TurnOutput {
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    top_logprobs: Vec::new(),
                    certainty: Vec::new(),
                    finish: FinishReason::Length,
                })
                .collect(),
            active,
            step: 0,
        }
    }

    /// Decodes at most `steps` more steps of `turn` (one token per sequence still in it) and
    /// says whether the turn is over. `after` and `stop` as in [`Session::turn`].
    pub fn continue_turn(
        &mut self,
        turn: &mut Turn,
        steps: usize,
        after: AfterTurn,
        stop: &mut dyn FnMut(usize, &[u32]) -> bool,
    ) -> bool {
        let limit = self.config.max_new_tokens;
        let last = turn.step.saturating_add(steps).min(limit);
        let active = &mut turn.active;
        while turn.step < last && active.iter().any(Option::is_some) {
            let step = turn.step;
            turn.step += 1;
            // Each sequence draws from its own stream, so they can draw on every thread at once
            // (a softmax over the whole vocabulary each).
            let config = &self.config;
            let mut choices: Vec<Option<Choice>> = active.iter().map(|_| None).collect();
            let draws = self.sequences.iter_mut().zip(active.iter()).zip(&mut choices);
            let draws: Vec<_> = draws.filter(|((_, slot), _)| slot.is_some()).collect();
            team::for_each(draws, |((sequence, _), choice)| {
                *choice = Some(choose_with_extras(&sequence.logits, config, &mut sequence.rng));
            });
            let mut ended = Vec::new();
            for (seq, (slot, choice)) in active.iter_mut().zip(choices).enumerate() {
                let (
                    Some(i),
                    Some(Choice {
                        sampled: (token, logprob),
                        top,
                        certainty,
                    }),
                ) = (*slot, choice)
                else {
                    continue;
                };
                let sequence = &mut self.sequences[seq];
                sequence.pending = Some(token);
                let out = &mut turn.outputs[i];
                out.tokens.push(token);
                out.logprobs.push(logprob);
                if config.top_logprobs > 0 {
                    out.top_logprobs.push(top);
                }
                out.certainty.extend(certainty);
                let finish = if self.config.stop_token_ids.contains(&token) {
                    Some(FinishReason::StopToken)
                } else if stop(seq, &out.tokens) {
                    Some(FinishReason::StopCondition)
                } else if step + 1 == limit {
                    Some(FinishReason::Length)
                } else {
                    None
                };
                if let Some(reason) = finish {
                    out.finish = reason;
                    *slot = None;
                    ended.push(seq);
                }
            }
            if after == AfterTurn::End {
                self.end(&ended);
            }
            let feeding: Vec<bool> = active.iter().map(Option::is_some).collect();
            if !feeding.iter().any(|&f| f) {
                break;
            }
            self.decode(&feeding);
        }
        turn.is_over(limit)
    }

    /// Feeds each live sequence's pending token where `feeding`, a padding slot elsewhere, in
    /// the shards that feed any; stores the next-token logits of those fed.
    fn decode(&mut self, feeding: &[bool]) {
        let busy: Vec<usize> = (0..self.shards.len())
            .filter(|&s| self.shards[s].rows.iter().any(|&seq| feeding[seq]))
            .collect();
        let feeds: Vec<Feed> = busy
            .iter()
            .map(|&s| {
                let rows = &self.shards[s].rows;
                let mut feed = Feed {
                    tokens: Vec::with_capacity(rows.len()),
                    positions: Vec::with_capacity(rows.len()),
                    padding: Vec::with_capacity(rows.len()),
                    width: 1,
                };
                for &seq in rows {
                    let sequence = &self.sequences[seq];
                    let token = feeding[seq].then(|| sequence.pending.expect("a sampled token to feed"));
                    feed.tokens.push(i64::from(token.unwrap_or(self.pad_id)));
                    feed.positions.push(sequence.position);
                    feed.padding.push(token.is_none());
                }
                feed
            })
            .collect();
        let outs = self.run_shards(&busy, &feeds, &[]);
        for ((&s, fed), feed) in busy.iter().zip(outs).zip(&feeds) {
            for (row, &seq) in self.shards[s].rows.iter().enumerate() {
                if feeding[seq] {
                    let sequence = &mut self.sequences[seq];
                    sequence.pending = None;
                    sequence.position += 1;
                    sequence.logits.clear();
                    sequence
                        .logits
                        .extend_from_slice(&fed.logits[row * self.vocab..(row + 1) * self.vocab]);
                    if let Some(routes) = &fed.routes {
                        feed.record_row(routes, row, &mut sequence.routes);
                    }
                }
            }
        }
    }

    /// Appends `tokens` after each listed sequence's last turn (its pending token first) and
    /// computes its next-token logits; all of them in one forward pass per shard.
    ///
    /// # Panics
    /// When a vision-language model is appended image tokens ([`Session::append_with_images`]
    /// shows their images).
    pub fn append(&mut self, additions: &[(usize, Vec<u32>)]) {
        if let Err(error) = self.append_with_images(additions, &[]) {
            panic!("appended tokens without their images: {error}");
        }
    }

    /// [`Session::append`] where addition `i` shows `images[i]` (none where `images` is
    /// shorter): its image tokens read their images' features, at the multimodal positions they
    /// give for a decoder that has them (see `session/shown_images.rs`). An error, before
    /// anything is appended, names the sequence whose image tokens do not match its images.
    pub fn append_with_images(
        &mut self,
        additions: &[(usize, Vec<u32>)],
        images: &[&[ProcessedImage]],
    ) -> Result<(), String> {
        let mut added: Vec<Option<Vec<u32>>> = vec![None; self.sequences.len()];
        let mut shown: Vec<Option<ShownImages<B>>> = self.sequences.iter().map(|_| None).collect();
        for (i, (seq, tokens)) in additions.iter().enumerate() {
            assert!(self.is_live(*seq), "sequence {seq} has ended");
            let sequence = &self.sequences[*seq];
            let pending = i64::from(sequence.pending.is_some());
            let shows = images.get(i).copied().unwrap_or_default();
            shown[*seq] = ShownImages::of(self.model, tokens, shows, sequence.position + pending, &self.device)
                .map_err(|e| format!("sequence {seq}: {e}"))?;
            let row: Vec<u32> = sequence.pending.iter().copied().chain(tokens.iter().copied()).collect();
            if !row.is_empty() {
                added[*seq] = Some(row);
            }
        }
        let busy: Vec<usize> = (0..self.shards.len())
            .filter(|&s| self.shards[s].rows.iter().any(|&seq| added[seq].is_some()))
            .collect();
        let mut feed_images = Vec::with_capacity(busy.len());
        let feeds: Vec<Feed> = busy
            .iter()
            .map(|&s| {
                let rows = &self.shards[s].rows;
                let width = rows
                    .iter()
                    .filter_map(|&seq| added[seq].as_ref().map(Vec::len))
                    .max()
                    .unwrap_or(1);
                let mut feed = Feed {
                    tokens: Vec::with_capacity(rows.len() * width),
                    positions: Vec::with_capacity(rows.len() * width),
                    padding: Vec::with_capacity(rows.len() * width),
                    width,
                };
                for &seq in rows {
                    let tokens = added[seq].as_deref().unwrap_or_default();
                    feed.push_row(tokens, self.sequences[seq].position, width, self.pad_id);
                }
                let shows: Vec<_> = (rows.iter())
                    .map(|&seq| {
                        let sequence = &self.sequences[seq];
                        (
                            shown[seq].as_ref(),
                            usize::from(sequence.pending.is_some()),
                            sequence.position,
                        )
                    })
                    .collect();
                feed_images.push(FeedImages::of_feed(self.model, &mut feed, &shows, &self.device));
                feed
            })
            .collect();
        let outs = self.run_shards(&busy, &feeds, &feed_images);
        for ((&s, fed), feed) in busy.iter().zip(outs).zip(&feeds) {
            for (row, &seq) in self.shards[s].rows.iter().enumerate() {
                if let Some(tokens) = &added[seq] {
                    let sequence = &mut self.sequences[seq];
                    sequence.pending = None;
                    sequence.position = match &shown[seq] {
                        Some(shown) => shown.next,
                        None => sequence.position + tokens.len() as i64,
                    };
                    sequence.logits.clear();
                    sequence
                        .logits
                        .extend_from_slice(&fed.logits[row * self.vocab..(row + 1) * self.vocab]);
                    if let Some(routes) = &fed.routes {
                        feed.record_row(routes, row, &mut sequence.routes);
                    }
                }
            }
        }
        Ok(())
    }

    /// Drops `seqs` from the cache: their conversations are over.
    pub fn end(&mut self, seqs: &[usize]) {
        if seqs.is_empty() {
            return;
        }
        let mut leaving = vec![false; self.sequences.len()];
        for &seq in seqs {
            leaving[seq] = self.sequences[seq].shard.take().is_some();
        }
        for shard in &mut self.shards {
            if shard.rows.iter().any(|&seq| leaving[seq]) {
                let keep: Vec<usize> = (0..shard.rows.len()).filter(|&r| !leaving[shard.rows[r]]).collect();
                shard.cache.retain(&keep);
                shard.rows.retain(|&seq| !leaving[seq]);
            }
        }
    }

    /// Runs `feeds[i]` through shard `busy[i]` (in parallel when there are several), with the
    /// images `images[i]` shows where there is one, and returns what each gives.
    fn run_shards(&mut self, busy: &[usize], feeds: &[Feed], images: &[Option<FeedImages<B>>]) -> Vec<Fed> {
        let longest = busy
            .iter()
            .zip(feeds)
            .map(|(&s, f)| {
                let rows = &self.shards[s].rows;
                rows.iter().map(|&seq| self.sequences[seq].position).max().unwrap_or(0) as usize + f.width
            })
            .max()
            .unwrap_or(0);
        if longest > self.rope.max_len() {
            self.rope = self.model.rope(longest.next_power_of_two(), &self.device);
        }
        let (model, rope, fused, device) = (self.model, &self.rope, &self.fused, &self.device);
        let mut runs: Vec<ShardRun<'_, B>> = Vec::with_capacity(busy.len());
        let mut pending = (busy.iter().enumerate()).zip(feeds).peekable();
        for (s, shard) in self.shards.iter_mut().enumerate() {
            if let Some(((i, _), feed)) = pending.next_if(|((_, b), _)| **b == s) {
                let images = images.get(i).and_then(Option::as_ref);
                runs.push(ShardRun {
                    cache: &mut shard.cache,
                    feed,
                    images,
                });
            }
        }
        let run = |run: &mut ShardRun<'_, B>| {
            let rope = run.images.and_then(|i| i.rope.as_ref()).unwrap_or(rope);
            let images = run.images.map(|i| (&i.features, i.slots.as_slice()));
            forward_feed(model, rope, fused, run.cache, run.feed, images, device)
        };
        let mut outs: Vec<Option<_>> = runs.iter().map(|_| None).collect();
        team::for_each(runs.iter_mut().zip(&mut outs).collect(), |(shard, out)| {
            *out = Some(run(shard))
        });
        outs.into_iter().map(|out| out.expect("each shard ran")).collect()
    }
}

impl Feed {
    /// Appends the experts of row `row`'s real tokens (per layer, from `routes`: `rows × width
    /// × k`) to a sequence's `record`.
    fn record_row(&self, routes: &[Vec<u32>], row: usize, record: &mut Vec<Vec<u32>>) {
        record.resize(routes.len(), Vec::new());
        let cells = self.padding.len();
        for (layer, chosen) in routes.iter().enumerate() {
            let k = chosen.len() / cells.max(1);
            for j in 0..self.width {
                let cell = row * self.width + j;
                if !self.padding[cell] {
                    record[layer].extend_from_slice(&chosen[cell * k..(cell + 1) * k]);
                }
            }
        }
    }

    /// Appends one row: `tokens` left-padded to `width`, positions from `start`.
    fn push_row(&mut self, tokens: &[u32], start: i64, width: usize, pad_id: u32) {
        let pad = width - tokens.len();
        for j in 0..width {
            let token = j.checked_sub(pad).map(|k| tokens[k]);
            self.tokens.push(i64::from(token.unwrap_or(pad_id)));
            self.positions.push(start + j.saturating_sub(pad) as i64);
            self.padding.push(token.is_none());
        }
    }
}

/// One forward pass of `feed` through `cache`: the logits of its last column, and the routing
/// of a mixture of experts. With `images`, each cell with a slot reads that image feature in
/// place of its token's embedding.
fn forward_feed<B: ReinBackend>(
    model: &CausalLm<B>,
    rope: &Rope<B>,
    fused: &FusedProjections<B>,
    cache: &mut KvCache<B>,
    feed: &Feed,
    images: Option<(&Tensor<B, 2>, &[Option<usize>])>,
    device: &B::Device,
) -> Fed {
    let rows = feed.positions.len() / feed.width;
    cache.reserve(feed.width);
    let routing = model.config().moe().map(|_| Routing::<B>::record());
    let padding: Option<Tensor<B, 2, Bool>> = feed.padding.iter().any(|&p| p).then(|| {
        Tensor::<B, 2, Int>::from_data(
            TensorData::new(
                feed.padding.iter().map(|&p| i64::from(p)).collect::<Vec<_>>(),
                [rows, feed.width],
            ),
            device,
        )
        .bool()
    });
    let ctx = Context {
        rope,
        positions: Tensor::from_data(TensorData::new(feed.positions.clone(), [rows, feed.width]), device),
        padding,
        sequences: None,
        fused: Some(fused),
        routing: routing.as_ref(),
    };
    let tokens = Tensor::from_data(TensorData::new(feed.tokens.clone(), [rows, feed.width]), device);
    let hidden = match images {
        Some((features, slots)) => {
            let embeddings = with_image_features(model.embed(tokens), slots, features.clone());
            model.hidden_of_embeddings(embeddings, &ctx, Some(cache))
        }
        None => model.hidden(tokens, &ctx, Some(cache)),
    };
    let last = model.fused_logits(hidden.narrow(1, feed.width - 1, 1), fused);
    Fed {
        logits: last.into_data().convert::<f32>().to_vec().unwrap_or_default(),
        routes: routing.map(|r| r.chosen(model.config().num_hidden_layers)),
    }
}

/// The stream of sample `sample` of prompt `prompt`: independent of batch composition.
/// The seed of prompt `prompt`'s samples in a batch generated with `seed`: a prompt sent on
/// its own with this seed draws the same tokens as it does at index `prompt` of the batch.
pub fn prompt_seed(seed: u64, prompt: usize) -> u64 {
    seed ^ (prompt as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The stream of sample `sample` of a prompt whose seed is `prompt_seed`.
fn sample_rng(prompt_seed: u64, sample: usize) -> SeededRng {
    SeededRng::new(prompt_seed ^ (sample as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F).rotate_left(17))
}

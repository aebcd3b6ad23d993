//! A batch's prompts prefilled a chunk of columns at a time ([`Prefill`]), so a server can put
//! other batches' decoding between the chunks of a long prompt (vLLM's chunked prefill).
//!
//! The prompts are left-padded into one `[prompts, width]` feed, as [`Session::start_seeded`]
//! feeds them; each pass runs the next `chunk` columns of it through the cache, whose keys and
//! values the later columns attend to as a turn's appended tokens do. One chunk as wide as the
//! feed is `start_seeded`'s one pass, bit for bit; narrower chunks compute the same function in
//! another order (equal within float rounding, tests/multi_turn.rs).
//!
//! A vision-language model's prompts carry images ([`Prefill::with_images`]): each image token
//! reads its image feature in place of its embedding, once, as the prompt is prefilled; the
//! cache then holds the images' keys and values and decoding never sees the images again. A
//! decoder with multimodal positions (Qwen2-VL) prefills each cell at its own rotary row and
//! decodes each row from one past its prompt's largest position.

use burn::tensor::Tensor;
use rein_model::ReinBackend;
use rein_model::lm::{CausalLm, KvCache, Rope};
use rein_model::vision::{ImageSide, MultimodalPositions, ProcessedImage, image_slots};

use super::{Feed, Sequence, Session, Shard, forward_feed, sample_rng};
use crate::token_choice::GenerationConfig;

/// Prompts being prefilled; [`Prefill::into_session`] once [`Prefill::advance`] has fed them all.
pub struct Prefill<'m, B: ReinBackend> {
    /// The session to be, its sequences without logits and shards yet.
    session: Session<'m, B>,
    /// The prompts' cache, one row per prompt (`None` without prompts).
    cache: Option<KvCache<B>>,
    /// The left-padded prompts, `[prompts, width]`.
    feed: Feed,
    /// Columns fed so far, and per pass.
    done: usize,
    chunk: usize,
    /// The last column's logits once every column is fed, `[prompts, vocab]`.
    logits: Vec<f32>,
    /// Per prompt, a mixture of experts' routing of its tokens fed so far.
    routes: Vec<Vec<Vec<u32>>>,
    /// Per sequence, the prompt (row of the feed) it starts from.
    rows: Vec<usize>,
    /// The prompts' image features and, per cell of the feed, the feature it reads.
    images: Option<(Tensor<B, 2>, Vec<Option<usize>>)>,
    /// Multimodal positions: one rotary row per cell of the feed (whose positions then number
    /// the cells), for the prompts' passes; decoding reads the session's plain tables.
    cell_rope: Option<Rope<B>>,
}

/// The images of a batch's prompts: their features in the decoder's embedding space (all
/// prompts' image tokens in order, prompt after prompt), the token they replace, and for a
/// decoder with multimodal positions each prompt's.
pub struct PromptImages<B: ReinBackend> {
    /// `[image tokens, hidden]`.
    pub features: Tensor<B, 2>,
    /// The image token.
    pub token: u32,
    /// Each prompt's multimodal positions (Qwen2-VL), or `None` when the positions are the
    /// tokens' indices.
    pub positions: Option<PromptPositions>,
}

/// A batch's multimodal positions.
pub struct PromptPositions {
    /// Each prompt's.
    pub prompts: Vec<MultimodalPositions>,
    /// How the decoder's rotary frequencies split over the three axes (`mrope_section`).
    pub section: [usize; 3],
}

impl<B: ReinBackend> PromptImages<B> {
    /// The images of `prompts` (`images[p]` are prompt `p`'s, processed for the image side
    /// `vision`), their features computed once for the batch; `None` when no prompt has one. An
    /// error when some do and there is no image side, or a prompt's image tokens do not match
    /// its images (naming the prompt).
    pub fn of_prompts(
        vision: Option<&ImageSide<B>>,
        prompts: &[Vec<u32>],
        images: &[&[ProcessedImage]],
        device: &B::Device,
    ) -> Result<Option<Self>, String> {
        if images.iter().all(|i| i.is_empty()) {
            return Ok(None);
        }
        let vision = vision.ok_or("the prompts have images, but the model reads no images")?;
        if images.len() != prompts.len() {
            return Err(format!("images for {} of the {} prompts", images.len(), prompts.len()));
        }
        let positions = (prompts.iter().zip(images).enumerate())
            .map(|(p, (tokens, images))| {
                vision
                    .positions(tokens, images)
                    .map(|r| r.map_err(|e| format!("prompt {p}: {e}")))
            })
            .collect::<Option<Result<Vec<_>, String>>>()
            .transpose()?
            .zip(vision.mrope_section())
            .map(|(prompts, section)| PromptPositions { prompts, section });
        Ok(Some(Self {
            features: vision.image_features(images.iter().flat_map(|i| i.iter()), device),
            token: vision.image_token_id(),
            positions,
        }))
    }
}

impl<'m, B: ReinBackend> Prefill<'m, B> {
    /// Sets up the session of [`Session::start_seeded`]'s arguments, whose prompts will be fed
    /// `chunk` columns a pass (at least one).
    pub fn new(
        model: &'m CausalLm<B>,
        prompts: &[Vec<u32>],
        seeds: &[u64],
        config: &GenerationConfig,
        pad_id: u32,
        chunk: usize,
        device: &B::Device,
    ) -> Self {
        assert_eq!(seeds.len(), prompts.len(), "one seed per prompt");
        let n = config.n.max(1);
        let streams: Vec<(usize, u64, usize)> = (0..prompts.len() * n).map(|i| (i / n, seeds[i / n], i % n)).collect();
        Self::of_streams(model, prompts, &streams, config, pad_id, chunk, device)
    }

    /// The session whose sequence `s` starts from prompt `streams[s].0` (each prompt prefilled
    /// once, however many sequences start from it) and draws sample `streams[s].2` of the prompt
    /// seed `streams[s].1`: [`Prefill::new`] is the streams `(p, seeds[p], j)` for `j < n`.
    /// `config.n` is not read. Sequences that share a prompt start from copies of its cache rows,
    /// the same values as prefilling it for each (tests/multi_turn.rs).
    pub fn of_streams(
        model: &'m CausalLm<B>,
        prompts: &[Vec<u32>],
        streams: &[(usize, u64, usize)],
        config: &GenerationConfig,
        pad_id: u32,
        chunk: usize,
        device: &B::Device,
    ) -> Self {
        assert!(
            streams.iter().all(|&(p, _, _)| p < prompts.len()),
            "streams of other prompts"
        );
        let width = prompts.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let session = Session {
            model,
            fused: model.fused_projections().with_precision(config.precision),
            rope: model.rope(width + 2 * config.max_new_tokens.max(1), device),
            config: config.clone(),
            pad_id,
            vocab: model.config().vocab_size,
            sequences: (streams.iter())
                .map(|&(p, seed, sample)| Sequence {
                    shard: None,
                    position: prompts[p].len() as i64,
                    logits: Vec::new(),
                    pending: None,
                    rng: sample_rng(seed, sample),
                    routes: Vec::new(),
                })
                .collect(),
            shards: Vec::new(),
            device: device.clone(),
        };
        let p = prompts.len();
        let cache = (p > 0).then(|| KvCache::new(model.config(), p, width + config.max_new_tokens.max(1), device));
        let mut feed = Feed {
            tokens: Vec::with_capacity(p * width),
            positions: Vec::with_capacity(p * width),
            padding: Vec::with_capacity(p * width),
            width,
        };
        for prompt in prompts {
            feed.push_row(prompt, 0, width, pad_id);
        }
        Self {
            session,
            cache,
            feed,
            done: 0,
            chunk: chunk.max(1),
            logits: Vec::new(),
            routes: vec![Vec::new(); p],
            rows: streams.iter().map(|&(p, _, _)| p).collect(),
            images: None,
            cell_rope: None,
        }
    }

    /// The same prefill with `images` read in place of the prompts' image tokens; an error when
    /// the prompts hold a different number of image tokens than there are features.
    pub fn with_images(mut self, images: PromptImages<B>) -> Result<Self, String> {
        // A padding cell reads no feature, whatever its token (the feed's ids are the prompts' u32s).
        let cells = (self.feed.tokens.iter().zip(&self.feed.padding))
            .map(|(&token, &padding)| if padding { u32::MAX } else { token as u32 });
        let slots = image_slots(cells, images.token);
        let (tokens, [features, _]) = (slots.iter().flatten().count(), images.features.dims());
        if tokens != features {
            return Err(format!(
                "the prompts hold {tokens} image tokens for {features} image features"
            ));
        }
        self.images = Some((images.features, slots));
        if let Some(positions) = images.positions {
            self.use_multimodal_positions(positions)?;
        }
        Ok(self)
    }

    /// Prefills each prompt at its multimodal positions: every cell of the feed gets its own
    /// rotary row (padding cells any), and each of the prompt's sequences decodes from its
    /// [`MultimodalPositions::next`].
    fn use_multimodal_positions(
        &mut self,
        PromptPositions {
            prompts: positions,
            section,
        }: PromptPositions,
    ) -> Result<(), String> {
        let (width, rows) = (self.feed.width, self.feed.positions.len() / self.feed.width);
        if positions.len() != rows {
            return Err(format!(
                "multimodal positions for {} of the {rows} prompts",
                positions.len()
            ));
        }
        let mut cells = Vec::with_capacity(rows * width);
        for (row, prompt) in positions.iter().enumerate() {
            let pad = width - prompt.positions.len();
            if self.feed.padding[row * width..row * width + pad].iter().any(|&p| !p) {
                return Err(format!("prompt {row}: positions for another number of tokens"));
            }
            cells.extend(std::iter::repeat_n([0; 3], pad));
            cells.extend_from_slice(&prompt.positions);
        }
        let config = self.session.model.config();
        self.cell_rope = Some(Rope::multimodal(config, &cells, section, &self.session.device));
        self.feed.positions = (0..cells.len() as i64).collect();
        for (sequence, &row) in self.session.sequences.iter_mut().zip(&self.rows) {
            sequence.position = positions[row].next;
        }
        Ok(())
    }

    /// Feeds the next chunk of columns; says whether every column has been fed.
    pub fn advance(&mut self) -> bool {
        let Some(cache) = &mut self.cache else {
            return true;
        };
        if self.done == self.feed.width {
            return true;
        }
        let end = self.feed.width.min(self.done + self.chunk);
        let columns = match (self.done, end) {
            (0, end) if end == self.feed.width => None, // the whole feed: no copy
            (start, end) => Some(self.feed.columns(start, end)),
        };
        let feed = columns.as_ref().unwrap_or(&self.feed);
        // A chunk's cells read the slots of its columns; the whole feed reads them all.
        let chunk_slots = match (&self.images, &columns) {
            (Some((_, slots)), Some(_)) => Some(self.feed.column_values(slots, self.done, end)),
            _ => None,
        };
        let images = (self.images.as_ref())
            .map(|(features, slots)| (features, chunk_slots.as_deref().unwrap_or(slots.as_slice())));
        let session = &self.session;
        let fed = forward_feed(
            session.model,
            self.cell_rope.as_ref().unwrap_or(&session.rope),
            &session.fused,
            cache,
            feed,
            images,
            &session.device,
        );
        if let Some(routes) = &fed.routes {
            for (row, record) in self.routes.iter_mut().enumerate() {
                feed.record_row(routes, row, record);
            }
        }
        self.done = end;
        if end == self.feed.width {
            self.logits = fed.logits;
        }
        end == self.feed.width
    }

    /// The prefilled session: each sequence with a copy of its prompt's cache rows, logits and
    /// routing, in shards of contiguous sequences. Feeds what [`Prefill::advance`] has not yet.
    pub fn into_session(mut self) -> Session<'m, B> {
        while !self.advance() {}
        let mut session = self.session;
        let rows = self.rows.len();
        let (Some(mut cache), true) = (self.cache, rows > 0) else {
            return session;
        };
        if !self.rows.iter().copied().eq(0..self.routes.len()) {
            cache.retain(&self.rows);
        }
        let vocab = session.vocab;
        for (sequence, &row) in session.sequences.iter_mut().zip(&self.rows) {
            sequence.logits = self.logits[row * vocab..(row + 1) * vocab].to_vec();
            sequence.routes = self.routes[row].clone();
        }
        // Shards of contiguous sequences.
        let count = B::decode_shards(rows).clamp(1, rows);
        let size = rows.div_ceil(count);
        let starts: Vec<usize> = (0..rows).step_by(size).collect();
        let mut whole = Some(cache);
        for (s, &start) in starts.iter().enumerate() {
            let range: Vec<usize> = (start..(start + size).min(rows)).collect();
            let shard_cache = match starts.len() {
                1 => whole.take().expect("one shard takes the whole cache"),
                _ => {
                    let mut c = whole.clone().expect("the prefilled cache");
                    c.retain(&range);
                    c
                }
            };
            for &seq in &range {
                session.sequences[seq].shard = Some(s);
            }
            session.shards.push(Shard {
                rows: range,
                cache: shard_cache,
            });
        }
        session
    }
}

impl Feed {
    /// Columns `start..end` of every row.
    fn columns(&self, start: usize, end: usize) -> Feed {
        Feed {
            tokens: self.column_values(&self.tokens, start, end),
            positions: self.column_values(&self.positions, start, end),
            padding: self.column_values(&self.padding, start, end),
            width: end - start,
        }
    }

    /// Columns `start..end` of every row of `values`, one per cell of the feed.
    fn column_values<T: Clone>(&self, values: &[T], start: usize, end: usize) -> Vec<T> {
        let (width, rows) = (self.width, self.positions.len() / self.width);
        (0..rows)
            .flat_map(|r| values[r * width + start..r * width + end].to_vec())
            .collect()
    }
}

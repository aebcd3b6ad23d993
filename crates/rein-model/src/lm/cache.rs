//! The key/value cache for incremental decoding.
//!
//! Keys and values live in buffers allocated once for the whole generation
//! (`[batch, kv_heads, capacity, head_dim]`) and are written in place; decoding attention
//! ([`crate::ReinBackend::cached_attention`]) reads the filled prefix in place. Rows can be dropped
//! when their sequences finish, so finished sequences stop costing compute.
//!
//! A sliding-window layer keeps no more keys than its window needs: its buffer holds about two
//! windows (or one prefill), and when it is full the keys no query can see any more are
//! dropped from its front (the last `window − 1` kept, moved to the start), so a long
//! generation costs each such layer `O(window)` memory, and the move happens once per window of
//! new tokens.

use burn::tensor::{Bool, Int, Tensor, TensorData, TensorPrimitive};

use super::LmConfig;
use crate::backend::ReinBackend;

/// One layer's keys and values.
#[derive(Debug, Clone)]
pub struct LayerCache<B: ReinBackend> {
    k: Option<Tensor<B, 4>>,
    v: Option<Tensor<B, 4>>,
    len: usize,
    /// The layer's sliding window, if it has one.
    window: Option<usize>,
    /// Positions dropped from the buffers' front: buffer position `j` holds position
    /// `dropped + j`.
    dropped: usize,
}

impl<B: ReinBackend> LayerCache<B> {
    /// Positions already cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the buffers hold (a window layer's stay near two windows).
    pub fn buffer_positions(&self) -> usize {
        self.k.as_ref().map_or(0, |k| k.dims()[2])
    }

    /// The first position the buffers still hold.
    pub fn dropped(&self) -> usize {
        self.dropped
    }

    /// Writes `k` and `v` (`[batch, kv_heads, seq, head_dim]`) after the cached positions and
    /// returns the whole buffers (`[batch, kv_heads, capacity, head_dim]`), of which the first
    /// `len() − dropped()` positions (new ones included) are filled: position `dropped() + j` at
    /// `j`. Drop them before the next append, so that it writes in place. A window layer first
    /// drops the keys the new tokens cannot see, when its buffers are full.
    pub(crate) fn append(&mut self, k: Tensor<B, 4>, v: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let seq = k.dims()[2];
        self.make_room(seq);
        let (start, end) = (self.len - self.dropped, self.len + seq);
        let write = |buffer: &mut Option<Tensor<B, 4>>, values: Tensor<B, 4>| {
            // Taking the buffer out keeps it uniquely owned, so the write happens in place.
            let written = B::write_cache(
                buffer.take().expect("cache buffer present").into_primitive().tensor(),
                values.into_primitive().tensor(),
                start,
            );
            let full = Tensor::<B, 4>::from_primitive(TensorPrimitive::Float(written));
            *buffer = Some(full.clone());
            full
        };
        let k = write(&mut self.k, k);
        let v = write(&mut self.v, v);
        self.len = end;
        (k, v)
    }

    /// Room in the buffers for `seq` more positions: a window layer whose buffers are full
    /// keeps the last `window − 1` positions (all the new tokens can still see), moved to the
    /// front, in buffers of two windows (or the `seq` needed, if more); a layer without a window
    /// grows its buffers only through [`KvCache::reserve`].
    fn make_room(&mut self, seq: usize) {
        let Some(window) = self.window else { return };
        let held = self.len - self.dropped;
        let capacity = self.buffer_positions();
        if held + seq <= capacity {
            return;
        }
        let keep = held.min(window.saturating_sub(1));
        let capacity = (keep + seq).max(2 * window);
        let from = held - keep;
        for buffer in [&mut self.k, &mut self.v] {
            let old = buffer.take().expect("cache buffer present");
            let [b, heads, _, dim] = old.dims();
            let fresh = Tensor::<B, 4>::zeros([b, heads, capacity, dim], &old.device());
            *buffer = Some(match keep {
                0 => fresh,
                _ => fresh.slice_assign([0..b, 0..heads, 0..keep, 0..dim], old.narrow(2, from, keep)),
            });
        }
        self.dropped = self.len - keep;
    }
}

/// The cache of every layer, plus which cached positions are padding.
#[derive(Debug, Clone)]
pub struct KvCache<B: ReinBackend> {
    layers: Vec<LayerCache<B>>,
    /// `[batch, capacity]`, `true` at padding positions; `None` while there is no padding.
    padding: Option<Tensor<B, 2, Bool>>,
    batch: usize,
    capacity: usize,
    len: usize,
}

/// The bytes of the keys and values [`KvCache::new`] allocates for `batch` sequences of up to
/// `capacity` positions (f32; saturating, so that a caller can compare any request with a
/// budget before allocating).
pub fn kv_cache_bytes(config: &LmConfig, batch: usize, capacity: usize) -> u64 {
    let per_position = 2 * config.kv_heads() as u64 * config.head_dim() as u64 * size_of::<f32>() as u64;
    (config.layer_attention().into_iter())
        .map(|attention| {
            let positions = attention.window().map_or(capacity, |w| capacity.min(2 * w)) as u64;
            (batch as u64).saturating_mul(positions).saturating_mul(per_position)
        })
        .fold(0u64, u64::saturating_add)
}

impl<B: ReinBackend> KvCache<B> {
    /// An empty cache for `batch` sequences of up to `capacity` positions (a sliding-window
    /// layer's buffers: two windows, when that is less): [`kv_cache_bytes`] of them.
    pub fn new(config: &LmConfig, batch: usize, capacity: usize, device: &B::Device) -> Self {
        let layers = config
            .layer_attention()
            .into_iter()
            .map(|attention| {
                let window = attention.window();
                let positions = window.map_or(capacity, |w| capacity.min(2 * w));
                let shape = [batch, config.kv_heads(), positions, config.head_dim()];
                LayerCache {
                    k: Some(Tensor::zeros(shape, device)),
                    v: Some(Tensor::zeros(shape, device)),
                    len: 0,
                    window,
                    dropped: 0,
                }
            })
            .collect();
        Self {
            layers,
            padding: None,
            batch,
            capacity,
            len: 0,
        }
    }

    /// Positions cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sequences in the cache.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Each layer's cache.
    pub fn layers(&self) -> &[LayerCache<B>] {
        &self.layers
    }

    pub(crate) fn layer(&mut self, i: usize) -> &mut LayerCache<B> {
        &mut self.layers[i]
    }

    /// Records the padding of `dims = [batch, seq]` new tokens and returns the padding of all
    /// keys they attend to (`[batch, len + seq]`), or `None` if nothing is padding.
    pub(crate) fn push_padding(
        &mut self,
        new: Option<Tensor<B, 2, Bool>>,
        dims: [usize; 2],
    ) -> Option<Tensor<B, 2, Bool>> {
        let [batch, seq] = dims;
        let end = self.len + seq;
        assert!(
            end <= self.capacity,
            "KV cache overflow: {end} positions in a cache of {}",
            self.capacity
        );
        match (new, self.padding.take()) {
            (None, None) => None,
            (new, existing) => {
                let device = new
                    .as_ref()
                    .map(|t| t.device())
                    .or_else(|| existing.as_ref().map(|t| t.device()))?;
                let existing =
                    existing.unwrap_or_else(|| Tensor::<B, 2, Int>::zeros([batch, self.capacity], &device).bool());
                let new = new.unwrap_or_else(|| Tensor::<B, 2, Int>::zeros([batch, seq], &device).bool());
                let full = existing.slice_assign([0..batch, self.len..end], new);
                let view = full.clone().narrow(1, 0, end);
                self.padding = Some(full);
                Some(view)
            }
        }
    }

    /// Marks the positions written by the last forward pass as cached.
    pub(crate) fn commit(&mut self) {
        self.len = self.layers.first().map_or(self.len, LayerCache::len);
    }

    /// Makes room for `additional` more positions, growing the buffers (to at least twice
    /// their capacity) when they are full; the cached positions are kept.
    pub fn reserve(&mut self, additional: usize) {
        let needed = self.len + additional;
        if needed <= self.capacity {
            return;
        }
        let capacity = needed.max(2 * self.capacity);
        let (len, batch) = (self.len, self.batch);
        // Window layers make their own room as they append.
        for layer in self.layers.iter_mut().filter(|l| l.window.is_none()) {
            for buffer in [&mut layer.k, &mut layer.v] {
                let old = buffer.take().expect("cache buffer present");
                let [b, heads, _, dim] = old.dims();
                let grown = Tensor::<B, 4>::zeros([b, heads, capacity, dim], &old.device());
                *buffer = Some(match len {
                    0 => grown,
                    _ => grown.slice_assign([0..b, 0..heads, 0..len, 0..dim], old.narrow(2, 0, len)),
                });
            }
        }
        self.padding = self.padding.take().map(|old| {
            let grown = Tensor::<B, 2, Int>::zeros([batch, capacity], &old.device()).bool();
            match len {
                0 => grown,
                _ => grown.slice_assign([0..batch, 0..len], old.narrow(1, 0, len)),
            }
        });
        self.capacity = capacity;
    }

    /// Keeps only the sequences at `rows` (in that order), dropping the others' keys and values.
    pub fn retain(&mut self, rows: &[usize]) {
        let Some(device) = self.layers.first().and_then(|l| l.k.as_ref()).map(|k| k.device()) else {
            return;
        };
        if rows.is_empty() {
            // No sequence left: empty buffers, without a gather over an empty index (on
            // burn-cuda a kernel launched over nothing fails, and the error surfaces at the
            // next read of any tensor).
            let empty = |t: Option<Tensor<B, 4>>| {
                t.map(|t| {
                    let [_, heads, capacity, dim] = t.dims();
                    Tensor::empty([0, heads, capacity, dim], &device)
                })
            };
            for layer in &mut self.layers {
                layer.k = empty(layer.k.take());
                layer.v = empty(layer.v.take());
            }
            self.padding = self.padding.take().map(|p| Tensor::empty([0, p.dims()[1]], &device));
            self.batch = 0;
            return;
        }
        let index = Tensor::<B, 1, Int>::from_data(
            TensorData::new(rows.iter().map(|&r| r as i64).collect::<Vec<_>>(), [rows.len()]),
            &device,
        );
        for layer in &mut self.layers {
            layer.k = layer.k.take().map(|k| k.select(0, index.clone()));
            layer.v = layer.v.take().map(|v| v.select(0, index.clone()));
        }
        self.padding = self.padding.take().map(|p| p.select(0, index));
        self.batch = rows.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `kv_cache_bytes` says is what `KvCache::new` allocates, sliding-window layers too.
    #[test]
    fn kv_cache_bytes_counts_what_new_allocates() {
        for window in ["null", "6"] {
            let config = LmConfig::from_json(
                serde_json::from_str(&format!(
                    r#"{{"model_type": "mistral", "vocab_size": 8, "hidden_size": 16, "intermediate_size": 8,
                    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                    "sliding_window": {window}}}"#
                ))
                .unwrap(),
            )
            .unwrap();
            for (batch, capacity) in [(1, 5), (3, 40)] {
                let cache = KvCache::<crate::Cpu>::new(&config, batch, capacity, &Default::default());
                let allocated: usize = (cache.layers.iter())
                    .flat_map(|layer| [&layer.k, &layer.v])
                    .map(|t| t.as_ref().unwrap().shape().num_elements() * size_of::<f32>())
                    .sum();
                assert_eq!(
                    kv_cache_bytes(&config, batch, capacity),
                    allocated as u64,
                    "window {window}"
                );
            }
        }
        let config = LmConfig::from_json(serde_json::json!({"model_type": "llama", "vocab_size": 8,
            "hidden_size": 16, "intermediate_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2}))
        .unwrap();
        assert_eq!(kv_cache_bytes(&config, usize::MAX, usize::MAX), u64::MAX);
    }
}

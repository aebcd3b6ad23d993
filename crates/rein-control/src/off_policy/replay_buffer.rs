//! The replay buffer of off-policy learning: the last `capacity` transitions of every
//! environment, in flat arrays allocated once (a ring: the oldest is overwritten), sampled
//! uniformly with replacement as Stable-Baselines3's `ReplayBuffer` (CleanRL's) samples, and
//! written whole into checkpoints so a resumed run samples what the uninterrupted one would.

use rein_core::SeededRng;

use super::Batch;

/// Transitions of `obs_dim`-feature observations and `act_dim`-dimensional actions.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayBuffer {
    capacity: usize,
    obs_dim: usize,
    act_dim: usize,
    obs: Vec<f32>,
    actions: Vec<f32>,
    rewards: Vec<f32>,
    next_obs: Vec<f32>,
    dones: Vec<f32>,
    /// Transitions stored (≤ capacity).
    len: usize,
    /// Where the next transition goes.
    next: usize,
}

/// A buffer that would not fit: what it needs and what there is.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "a replay buffer of {capacity} transitions ({floats} floats each) needs {}; {}",
    bytes.map_or("more bytes than a 64-bit count holds".to_string(), |b| format!("{:.1} GiB", b as f64 / GIB)),
    available.map_or("it cannot be counted".to_string(), |a| format!("{:.1} GiB is available", a as f64 / GIB))
)]
pub struct BufferTooLarge {
    /// Transitions asked for.
    pub capacity: usize,
    /// Floats per transition.
    pub floats: usize,
    /// Bytes needed (`None`: more than `u64` counts).
    pub bytes: Option<u64>,
    /// Bytes available.
    pub available: Option<u64>,
}

const GIB: f64 = (1u64 << 30) as f64;

impl ReplayBuffer {
    /// A buffer of `capacity` transitions, allocated now. Refused before allocating when it
    /// needs more than `available` bytes (the caller passes [`rein_run::memory::available_bytes`]).
    pub fn new(
        capacity: usize,
        obs_dim: usize,
        act_dim: usize,
        available: Option<u64>,
    ) -> Result<Self, BufferTooLarge> {
        let floats = 2 * obs_dim + act_dim + 2;
        let bytes = (capacity as u64).checked_mul(4 * floats as u64);
        let fits = match (bytes, available) {
            (None, _) => false,
            (Some(b), Some(a)) => b <= a,
            (Some(b), None) => b <= isize::MAX as u64,
        };
        if !fits {
            return Err(BufferTooLarge {
                capacity,
                floats,
                bytes,
                available,
            });
        }
        Ok(Self {
            capacity,
            obs_dim,
            act_dim,
            obs: vec![0.0; capacity * obs_dim],
            actions: vec![0.0; capacity * act_dim],
            rewards: vec![0.0; capacity],
            next_obs: vec![0.0; capacity * obs_dim],
            dones: vec![0.0; capacity],
            len: 0,
            next: 0,
        })
    }

    /// Transitions stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is stored yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Stores one step of `n` environments (row-major, `n` rows each); `terminated` marks the
    /// transitions whose episode ended there (not a truncation: those bootstrap from `next_obs`,
    /// the final observation).
    ///
    /// # Panics
    /// If the slices' lengths disagree with each other or with the buffer's dimensions.
    pub fn push(&mut self, obs: &[f32], actions: &[f32], rewards: &[f32], next_obs: &[f32], terminated: &[bool]) {
        let n = rewards.len();
        assert!(
            obs.len() == n * self.obs_dim
                && next_obs.len() == n * self.obs_dim
                && actions.len() == n * self.act_dim
                && terminated.len() == n,
            "a step of {n} transitions with {} observation and {} action values",
            obs.len(),
            actions.len()
        );
        for i in 0..n {
            let (o, a, at) = (self.obs_dim, self.act_dim, self.next);
            self.obs[at * o..(at + 1) * o].copy_from_slice(&obs[i * o..(i + 1) * o]);
            self.next_obs[at * o..(at + 1) * o].copy_from_slice(&next_obs[i * o..(i + 1) * o]);
            self.actions[at * a..(at + 1) * a].copy_from_slice(&actions[i * a..(i + 1) * a]);
            self.rewards[at] = rewards[i];
            self.dones[at] = f32::from(u8::from(terminated[i]));
            self.next = (at + 1) % self.capacity;
            self.len = (self.len + 1).min(self.capacity);
        }
    }

    /// `batch` indices drawn uniformly, with replacement, from the stored transitions.
    ///
    /// # Panics
    /// If the buffer is empty.
    pub fn sample_indices(&self, rng: &mut SeededRng, batch: usize) -> Vec<usize> {
        assert!(self.len > 0, "sampling an empty replay buffer");
        (0..batch).map(|_| rng.below(self.len as u64) as usize).collect()
    }

    /// The transitions at `indices`, row-major.
    pub fn gather(&self, indices: &[usize]) -> Batch {
        let rows = |values: &[f32], width: usize| -> Vec<f32> {
            indices
                .iter()
                .flat_map(|&i| values[i * width..(i + 1) * width].iter().copied())
                .collect()
        };
        Batch {
            rows: indices.len(),
            obs: rows(&self.obs, self.obs_dim),
            actions: rows(&self.actions, self.act_dim),
            rewards: rows(&self.rewards, 1),
            next_obs: rows(&self.next_obs, self.obs_dim),
            dones: rows(&self.dones, 1),
        }
    }

    /// The buffer as a checkpoint section: its sizes and the stored rows, little-endian.
    pub fn to_bytes(&self) -> Vec<u8> {
        let header = [self.capacity, self.obs_dim, self.act_dim, self.len, self.next];
        let mut bytes: Vec<u8> = header.iter().flat_map(|&x| (x as u64).to_le_bytes()).collect();
        for (values, width) in self.columns() {
            bytes.extend(values[..self.len * width].iter().flat_map(|x| x.to_le_bytes()));
        }
        bytes
    }

    /// Takes the contents of a [`ReplayBuffer::to_bytes`] section, in place (no second buffer is
    /// allocated); `false`, the buffer unchanged, when the bytes are not such a section or its
    /// sizes are not this buffer's (another recipe's buffer).
    pub fn read_bytes(&mut self, bytes: &[u8]) -> bool {
        let word = |i: usize| -> Option<usize> {
            let b = bytes.get(i * 8..(i + 1) * 8)?;
            usize::try_from(u64::from_le_bytes(b.try_into().ok()?)).ok()
        };
        let (Some(cap), Some(o), Some(a), Some(len), Some(next)) = (word(0), word(1), word(2), word(3), word(4)) else {
            return false;
        };
        let widths = [o, a, 1, o, 1];
        if [cap, o, a] != [self.capacity, self.obs_dim, self.act_dim]
            || len > cap
            || next >= cap.max(1)
            || bytes.len() != 40 + 4 * len * widths.iter().sum::<usize>()
        {
            return false;
        }
        let mut floats = bytes[40..]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        for (column, width) in [
            &mut self.obs,
            &mut self.actions,
            &mut self.rewards,
            &mut self.next_obs,
            &mut self.dones,
        ]
        .into_iter()
        .zip(widths)
        {
            for (x, value) in column[..len * width].iter_mut().zip(&mut floats) {
                *x = value;
            }
        }
        (self.len, self.next) = (len, next);
        true
    }

    fn columns(&self) -> [(&[f32], usize); 5] {
        [
            (&self.obs, self.obs_dim),
            (&self.actions, self.act_dim),
            (&self.rewards, 1),
            (&self.next_obs, self.obs_dim),
            (&self.dones, 1),
        ]
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    /// Steps of 2 environments with 1 observation and 1 action: transition `k` holds `k`.
    fn filled(capacity: usize, steps: usize) -> ReplayBuffer {
        let mut buffer = ReplayBuffer::new(capacity, 1, 1, None).unwrap();
        for step in 0..steps {
            let k = [2 * step, 2 * step + 1].map(|k| k as f32);
            let next = k.map(|k| k + 0.5);
            buffer.push(&k, &k, &k, &next, &[step % 2 == 0, false]);
        }
        buffer
    }

    #[test]
    fn the_oldest_transitions_are_overwritten() {
        let buffer = filled(5, 4);
        assert_eq!(buffer.len(), 5);
        // Transitions 0..8 went into 5 slots: 5, 6, 7 overwrote 0, 1, 2.
        assert_eq!(buffer.obs, [5.0, 6.0, 7.0, 3.0, 4.0]);
        assert_eq!(buffer.next_obs, [5.5, 6.5, 7.5, 3.5, 4.5]);
        // Environment 0 terminated at the even steps: transitions 0, 4 (and 8, …).
        assert_eq!(buffer.dones, [0.0, 0.0, 0.0, 0.0, 1.0]);
        let batch = buffer.gather(&[3, 0]);
        assert_eq!((batch.rows, batch.rewards), (2, vec![3.0, 5.0]));
    }

    #[test]
    fn samples_come_from_the_stored_transitions_only() {
        let buffer = filled(100, 3);
        let indices = buffer.sample_indices(&mut SeededRng::new(1), 1000);
        assert!(indices.iter().all(|&i| i < 6));
        assert!((0..6).all(|i| indices.contains(&i)));
    }

    #[test]
    fn a_buffer_too_large_is_refused_before_allocating() {
        let error = ReplayBuffer::new(1 << 40, 3, 1, Some(8 << 30)).unwrap_err();
        assert_eq!(error.floats, 9);
        assert_eq!(
            error.to_string(),
            "a replay buffer of 1099511627776 transitions (9 floats each) needs 36864.0 GiB; 8.0 GiB is available"
        );
        let error = ReplayBuffer::new(usize::MAX, 3, 1, None).unwrap_err();
        assert!(
            error.to_string().contains("more bytes than a 64-bit count holds"),
            "{error}"
        );
    }

    proptest::proptest! {
        /// A buffer read back from its bytes is the same buffer, and samples the same.
        #[test]
        fn bytes_round_trip(capacity in 1usize..20, steps in 0usize..30, seed in 0u64..100) {
            let buffer = filled(capacity, steps);
            let mut read = ReplayBuffer::new(capacity, 1, 1, None).unwrap();
            proptest::prop_assert!(read.read_bytes(&buffer.to_bytes()));
            proptest::prop_assert_eq!(&read, &buffer);
            if !buffer.is_empty() {
                let mut rng = SeededRng::new(seed);
                proptest::prop_assert_eq!(
                    read.sample_indices(&mut rng.clone(), 8),
                    buffer.sample_indices(&mut rng, 8)
                );
            }
            let mut other = ReplayBuffer::new(capacity + 1, 1, 1, None).unwrap();
            proptest::prop_assert!(!other.read_bytes(&buffer.to_bytes()));
            let bytes = buffer.to_bytes();
            proptest::prop_assert!(!read.read_bytes(&bytes[..bytes.len() - 1]));
            proptest::prop_assert_eq!(&read, &buffer, "a refused section leaves the buffer as it was");
        }
    }
}

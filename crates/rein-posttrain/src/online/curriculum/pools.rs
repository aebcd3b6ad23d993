//! Difficulty pools (`[curriculum] kind = "pools"`, after prime-rl's `DifficultyPools`): each
//! training prompt's running pass rate `p ← s · p + (1 − s) · ρ` (ρ the accuracy of its latest
//! group, `s` the recipe's `smoothing`; the first group sets `p = ρ`) puts it in the easy pool
//! (`p ≥ easy_above`), the hard pool (`p ≤ hard_below`) or the normal one (every prompt starts
//! there). Each prompt of a batch comes from the easy pool with probability `easy`, the hard one
//! with `hard` and the normal one otherwise (a pool without prompts gives its share to the
//! others), drawn uniformly within its pool. The pass rates are part of the run's state, so a
//! resumed run draws as the uninterrupted one.

use rein_core::SeededRng;
use rein_recipe::CurriculumSection;
use serde::{Deserialize, Serialize};

/// Each training prompt's running pass rate (`None` until its first group).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct DifficultyPools {
    pass_rates: Vec<Option<f64>>,
}

/// The three pools, in the order of [`DifficultyPools::sizes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pool {
    Easy,
    Normal,
    Hard,
}

impl DifficultyPools {
    pub(crate) fn new(prompts: usize) -> Self {
        Self {
            pass_rates: vec![None; prompts],
        }
    }

    /// How many prompts it tracks.
    pub(crate) fn len(&self) -> usize {
        self.pass_rates.len()
    }

    fn pool(&self, prompt: usize, c: &CurriculumSection) -> Pool {
        match self.pass_rates[prompt] {
            Some(p) if p >= c.easy_above => Pool::Easy,
            Some(p) if p <= c.hard_below => Pool::Hard,
            _ => Pool::Normal,
        }
    }

    /// How many prompts each pool holds: easy, normal, hard.
    pub(crate) fn sizes(&self, c: &CurriculumSection) -> [usize; 3] {
        let mut sizes = [0; 3];
        for prompt in 0..self.pass_rates.len() {
            sizes[self.pool(prompt, c) as usize] += 1;
        }
        sizes
    }

    /// The next prompt: a pool by the recipe's shares, then a prompt of it uniformly.
    pub(crate) fn pick(&self, c: &CurriculumSection, rng: &mut SeededRng) -> usize {
        let sizes = self.sizes(c);
        let shares = [c.easy, (1.0 - c.easy - c.hard).max(0.0), c.hard];
        let mut weights: Vec<f64> = (shares.iter().zip(sizes))
            .map(|(&s, n)| if n > 0 { s } else { 0.0 })
            .collect();
        if weights.iter().sum::<f64>() <= 0.0 {
            // Only pools whose share is 0 have prompts: draw among those evenly.
            weights = sizes.iter().map(|&n| f64::from(u8::from(n > 0))).collect();
        }
        let chosen = [Pool::Easy, Pool::Normal, Pool::Hard][super::draw_weighted(&weights, rng)];
        let members: Vec<usize> = (0..self.pass_rates.len())
            .filter(|&p| self.pool(p, c) == chosen)
            .collect();
        members[rng.below(members.len() as u64) as usize]
    }

    /// Folds a new group's accuracy into its prompt's running pass rate.
    pub(crate) fn observe(&mut self, prompt: usize, accuracy: f64, c: &CurriculumSection) {
        let rate = &mut self.pass_rates[prompt];
        *rate = Some(match *rate {
            Some(p) => c.smoothing * p + (1.0 - c.smoothing) * accuracy,
            None => accuracy,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section() -> CurriculumSection {
        CurriculumSection {
            easy: 0.25,
            hard: 0.25,
            easy_above: 0.9,
            hard_below: 0.1,
            smoothing: 0.5,
            ..CurriculumSection::default()
        }
    }

    /// By hand, smoothing 0.5: a prompt solved 4/4 is easy at once (p = 1); one more group at
    /// 0/4 gives p = 0.5 (normal); then 0/4 twice: 0.25, 0.125 (normal), then 0.0625 (hard).
    #[test]
    fn pass_rates_move_prompts_between_pools() {
        let c = section();
        let mut pools = DifficultyPools::new(3);
        assert_eq!(pools.sizes(&c), [0, 3, 0]);
        pools.observe(0, 1.0, &c);
        assert_eq!(pools.pool(0, &c), Pool::Easy);
        for (accuracy, expected, pool) in [
            (0.0, 0.5, Pool::Normal),
            (0.0, 0.25, Pool::Normal),
            (0.0, 0.125, Pool::Normal),
            (0.0, 0.0625, Pool::Hard),
        ] {
            pools.observe(0, accuracy, &c);
            assert_eq!(pools.pass_rates[0], Some(expected));
            assert_eq!(pools.pool(0, &c), pool);
        }
        pools.observe(1, 0.95, &c);
        assert_eq!(pools.sizes(&c), [1, 1, 1]);
    }

    /// Over many draws each pool gets its share (easy 25%, normal 50%, hard 25%, within 2
    /// points), every prompt of a pool is drawn, and a pool without prompts gives its share away.
    #[test]
    fn draws_follow_the_shares() {
        let c = section();
        let mut pools = DifficultyPools::new(10);
        for p in 0..2 {
            pools.observe(p, 1.0, &c); // easy: 0, 1
        }
        for p in 2..5 {
            pools.observe(p, 0.0, &c); // hard: 2, 3, 4
        }
        let mut rng = SeededRng::new(3);
        let mut counts = [0usize; 10];
        let draws = 40_000;
        for _ in 0..draws {
            counts[pools.pick(&c, &mut rng)] += 1;
        }
        let share = |range: std::ops::Range<usize>| counts[range].iter().sum::<usize>() as f64 / draws as f64;
        assert!((share(0..2) - 0.25).abs() < 0.02, "{counts:?}");
        assert!((share(2..5) - 0.25).abs() < 0.02, "{counts:?}");
        assert!((share(5..10) - 0.5).abs() < 0.02, "{counts:?}");
        assert!(counts.iter().all(|&n| n > 0));
        // No easy prompts left: easy's share goes to the others (hard 1/3, normal 2/3).
        let mut pools = DifficultyPools::new(4);
        pools.observe(0, 0.0, &c);
        let hard = (0..30_000).filter(|_| pools.pick(&c, &mut rng) == 0).count() as f64 / 30_000.0;
        assert!((hard - 1.0 / 3.0).abs() < 0.02, "{hard}");
        // Only a pool whose share is 0 has prompts: it is drawn from.
        let none_hard = CurriculumSection {
            hard: 0.0,
            easy: 1.0,
            ..c
        };
        let all_hard = DifficultyPools {
            pass_rates: vec![Some(0.0); 3],
        };
        assert!(all_hard.pick(&none_hard, &mut rng) < 3);
    }
}

//! A reward plugin that attacks the host when a group's metadata says `{"attack": "..."}` and
//! otherwise behaves: 1 when a completion equals the reference, else 0. One instance can thus
//! be attacked and then asked to score a good batch, showing the host recovered.
//!
//! Its config may name an attack for `init` (`{"attack": "sleep"}`): the plugin then blocks
//! before it can score anything.

use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime};

use rein_pdk::{Config, ConfigKey, Group, Metadata, Reward, Score};

struct Hostile;

fn recurse(depth: u64) -> u64 {
    if depth == 0 {
        0
    } else {
        1 + recurse(black_box(depth - 1))
    }
}

fn sleep_forever() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

impl Reward for Hostile {
    const METADATA: Metadata = Metadata::new("hostile-reward", "attacks the host on request")
        .config(&[ConfigKey::new("attack", "an attack in init: sleep, sleep-forever")]);

    fn new(config: &Config) -> Result<Self, String> {
        match config.str_or("attack", "")? {
            "" => {}
            "sleep" => std::thread::sleep(Duration::from_secs(3600)),
            "sleep-forever" => sleep_forever(),
            other => return Err(format!("unknown init attack `{other}`")),
        }
        Ok(Hostile)
    }

    fn score(&mut self, group: &Group) -> Result<Vec<Score>, String> {
        let n = group.completions.len();
        let attack = group
            .metadata_json()?
            .get("attack")
            .and_then(|a| a.as_str())
            .map(String::from);
        match attack.as_deref() {
            None => {}
            Some("infinite-loop") => {
                let mut x = 0u64;
                loop {
                    x = black_box(x.wrapping_add(1));
                }
            }
            Some("memory-bomb") => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    black_box(&hoard);
                }
            }
            Some("deep-recursion") => return Ok(vec![Score::new(recurse(black_box(u64::MAX)) as f64); n]),
            Some("panic") => panic!("the hostile plugin panics on purpose"),
            Some("oversized-output") => {
                // 80 MiB of component names: over the host's 64 MiB output limit, under its
                // 256 MiB memory limit.
                let name = "x".repeat(1 << 20);
                let mut score = Score::new(0.0);
                score.components = (0..80).map(|i| (format!("{i}{name}"), 1.0)).collect();
                return Ok(vec![score; 1]
                    .into_iter()
                    .chain(vec![Score::new(0.0); n.saturating_sub(1)])
                    .collect());
            }
            Some("nan") => return Ok(vec![Score::new(f64::NAN); n]),
            Some("infinity") => return Ok(vec![Score::new(f64::INFINITY); n]),
            Some("nan-component") => return Ok(vec![Score::new(0.0).with("bad", f64::NAN); n]),
            Some("wrong-length") => return Ok(vec![Score::new(1.0); n + 1]),
            // Step scores the host must refuse (the completions are one character each).
            Some("step-past-the-end") => {
                return Ok(vec![
                    Score {
                        steps: vec![(0, 2, 1.0)],
                        ..Score::new(0.0)
                    };
                    n
                ]);
            }
            Some("overlapping-steps") => {
                return Ok(vec![
                    Score {
                        steps: vec![(0, 1, 1.0), (0, 1, 0.0)],
                        ..Score::new(0.0)
                    };
                    n
                ]);
            }
            Some("nan-step") => {
                return Ok(vec![
                    Score {
                        steps: vec![(0, 1, f64::NAN)],
                        ..Score::new(0.0)
                    };
                    n
                ]);
            }
            Some("flood-stdout") => {
                for i in 0..100_000 {
                    println!("line {i} of a chatty plugin");
                }
            }
            Some("guest-error") => return Err("refusing on purpose".into()),
            // Blocking on the clocks: one long sleep, sleeping in a loop, spinning on the clock.
            Some("sleep") => std::thread::sleep(Duration::from_secs(3600)),
            Some("sleep-forever") => sleep_forever(),
            Some("spin-on-clock") => {
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(3600) {
                    black_box(());
                }
            }
            // The clocks as a score: wall-clock seconds since the epoch, then nanoseconds of
            // monotonic time a short sleep took.
            Some("clock") => {
                let wall = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_err(|e| e.to_string())?;
                let start = Instant::now();
                std::thread::sleep(Duration::from_millis(5));
                let slept = start.elapsed();
                let score = Score::new(wall.as_secs_f64()).with("slept_ns", slept.as_nanos() as f64);
                return Ok(vec![score; n]);
            }
            Some(other) => return Err(format!("unknown attack `{other}`")),
        }
        let reference = group.reference.as_deref().unwrap_or_default();
        Ok(group.completions.iter().map(|c| Score::from(c == reference)).collect())
    }
}

rein_pdk::export_reward!(Hostile);

//! The epoch ticker: one thread advancing the epoch of every live engine each [`TICK`], which is
//! how per-call deadlines are counted.

use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use wasmtime::{Engine, EngineWeak};

/// How often the ticker advances every engine's epoch; deadlines are counted in ticks.
pub(crate) const TICK: Duration = Duration::from_millis(2);

/// One thread advancing the epoch of every live engine each [`TICK`]; it sleeps while there
/// are none. Engines are held weakly, so dropping the last plugin of an engine frees it.
pub(crate) struct Ticker {
    engines: Mutex<Vec<EngineWeak>>,
    thread: std::thread::Thread,
}

pub(crate) fn ticker() -> &'static Ticker {
    static TICKER: OnceLock<Ticker> = OnceLock::new();
    TICKER.get_or_init(|| {
        let thread = std::thread::Builder::new()
            .name("rein-epoch-ticker".into())
            .spawn(|| {
                loop {
                    let ticker = ticker();
                    let idle = {
                        let mut engines = ticker.engines.lock().unwrap_or_else(|e| e.into_inner());
                        engines.retain(|weak| match weak.upgrade() {
                            Some(engine) => {
                                engine.increment_epoch();
                                true
                            }
                            None => false,
                        });
                        engines.is_empty()
                    };
                    if idle {
                        std::thread::park();
                    } else {
                        std::thread::sleep(TICK);
                    }
                }
            })
            .expect("spawning the epoch ticker thread");
        Ticker {
            engines: Mutex::new(Vec::new()),
            thread: thread.thread().clone(),
        }
    })
}

impl Ticker {
    pub(crate) fn register(&self, engine: &Engine) {
        self.engines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(engine.weak());
        self.thread.unpark();
    }
}

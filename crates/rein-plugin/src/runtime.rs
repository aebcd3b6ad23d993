//! Engines and plugin loading.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use rein_core::{PluginError, PluginErrorKind};
use wasmtime::component::Component;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::cache::ArtifactCache;
use crate::imports::Import;
use crate::plugin::Plugin;
use rein_core::SandboxLimits;

/// A plugin's name in errors before its metadata is read: its file name without `.wasm`.
fn stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Reads a component file, refusing one over `max_module_mib` before reading it.
fn read_component(path: &Path, limits: &SandboxLimits) -> Result<Vec<u8>, PluginError> {
    let io = |e: std::io::Error| {
        let kind = PluginErrorKind::Io {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        PluginError::new(stem(path), None, kind)
    };
    let size = std::fs::metadata(path).map_err(io)?.len();
    let cap = limits.max_module_mib << 20;
    if size > cap {
        let kind = PluginErrorKind::ModuleTooLarge { size, limit: cap };
        return Err(PluginError::new(stem(path), None, kind));
    }
    std::fs::read(path).map_err(io)
}

/// Settings that change generated code get their own engine (and artifact cache key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct EngineKey {
    fuel: bool,
    stack_bytes: u64,
    canonicalize_nans: bool,
}

/// Loads plugins. Holds the wasmtime engines (one per combination of fuel metering and stack
/// size in use) and the artifact cache; cheap to share by reference across threads.
pub struct PluginRuntime {
    engines: Mutex<HashMap<EngineKey, Engine>>,
    cache: Option<ArtifactCache>,
}

impl std::fmt::Debug for PluginRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginRuntime")
            .field("cache", &self.cache)
            .finish_non_exhaustive()
    }
}

impl Default for PluginRuntime {
    fn default() -> Self {
        Self::new(ArtifactCache::default_location())
    }
}

impl PluginRuntime {
    /// A runtime caching compiled components in `cache` (or not at all).
    pub fn new(cache: Option<ArtifactCache>) -> Self {
        Self {
            engines: Mutex::new(HashMap::new()),
            cache,
        }
    }

    /// The artifact cache in use.
    pub fn cache(&self) -> Option<&ArtifactCache> {
        self.cache.as_ref()
    }

    /// Loads the component at `path` under `limits`: reads it (refusing files over
    /// `max_module_mib`), compiles it or takes it from the cache, checks which rein interface
    /// and version it exports and that the sandbox provides everything it imports, and reads
    /// its metadata.
    pub fn load(&self, path: impl AsRef<Path>, limits: SandboxLimits) -> Result<Plugin, PluginError> {
        let path = path.as_ref();
        let wasm = read_component(path, &limits)?;
        self.load_bytes(&stem(path), &wasm, limits)
    }

    /// Loads a component from memory; `name` stands for the plugin in errors until its
    /// metadata is read.
    pub fn load_bytes(&self, name: &str, wasm: &[u8], limits: SandboxLimits) -> Result<Plugin, PluginError> {
        let (engine, component, previous) = self.compile(name, wasm, &limits)?;
        Plugin::new(name, engine, component, limits, previous)
    }

    /// The interfaces the component at `path` imports and what the sandbox gives each, whether
    /// or not it can load.
    pub fn imports(&self, path: impl AsRef<Path>) -> Result<Vec<Import>, PluginError> {
        let path = path.as_ref();
        let limits = SandboxLimits::default();
        let wasm = read_component(path, &limits)?;
        let (engine, component, _) = self.compile(&stem(path), &wasm, &limits)?;
        let ty = component.component_type();
        Ok(ty.imports(&engine).map(|(name, _)| Import::of(name)).collect())
    }

    /// Compiles (or takes from the cache) a component under `limits`, one of an earlier version
    /// after adopting its names ([`crate::previous`]), with the version it was built against.
    fn compile(
        &self,
        name: &str,
        wasm: &[u8],
        limits: &SandboxLimits,
    ) -> Result<(Engine, Component, Option<&'static str>), PluginError> {
        let fail = |kind| PluginError::new(name, None, kind);
        limits.validate().map_err(|reason| {
            fail(PluginErrorKind::Host {
                reason: format!("invalid limits: {reason}"),
            })
        })?;
        let cap = limits.max_module_mib << 20;
        if wasm.len() as u64 > cap {
            return Err(fail(PluginErrorKind::ModuleTooLarge {
                size: wasm.len() as u64,
                limit: cap,
            }));
        }
        let engine = self.engine(limits).map_err(|e| {
            fail(PluginErrorKind::Host {
                reason: format!("{e:#}"),
            })
        })?;
        let adopted = crate::previous::adopt(wasm);
        let wasm = adopted.as_ref().map_or(wasm, |(adopted, _)| adopted.as_slice());
        let compiled = match &self.cache {
            Some(cache) => cache.load_or_compile(&engine, wasm).map(|(c, _)| c),
            None => Component::new(&engine, wasm),
        };
        let component = compiled.map_err(|e| {
            fail(PluginErrorKind::InvalidComponent {
                reason: format!("{e:#}"),
            })
        })?;
        Ok((engine, component, adopted.map(|(_, version)| version)))
    }

    fn engine(&self, limits: &SandboxLimits) -> wasmtime::Result<Engine> {
        let key = EngineKey {
            fuel: limits.fuel.is_some(),
            stack_bytes: limits.stack_bytes(),
            canonicalize_nans: limits.canonicalize_nans,
        };
        let mut engines = self.engines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(engine) = engines.get(&key) {
            return Ok(engine.clone());
        }
        let engine = Engine::new(&engine_config(key))?;
        crate::epoch::ticker().register(&engine);
        engines.insert(key, engine.clone());
        Ok(engine)
    }
}

fn engine_config(key: EngineKey) -> Config {
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(256)
        .total_core_instances(1024)
        .total_memories(256)
        .total_tables(1024)
        .total_stacks(0)
        // Python and JavaScript guests bundle an interpreter: many core instances, large tables.
        .max_core_instances_per_component(64)
        .max_memories_per_component(16)
        .max_tables_per_component(64)
        .max_component_instance_size(8 << 20)
        .max_core_instance_size(8 << 20)
        .table_elements(200_000)
        .max_memory_size(4 << 30);
    let mut config = Config::new();
    config
        .wasm_component_model(true)
        .concurrency_support(false)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool))
        .epoch_interruption(true)
        .consume_fuel(key.fuel)
        .max_wasm_stack(key.stack_bytes as usize)
        .cranelift_nan_canonicalization(key.canonicalize_nans)
        .relaxed_simd_deterministic(true);
    // `REIN_PERF_MAP=1` lets `perf report` name JIT-compiled plugin functions.
    if std::env::var_os("REIN_PERF_MAP").is_some() {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    config
}

//! On-disk cache of compiled components.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// A directory of precompiled components (`<sha256 of wasm>-<engine hash>.cwasm`).
///
/// The key covers the exact `.wasm` bytes and the engine's compatibility hash (wasmtime
/// version, target, and every setting that changes generated code, such as fuel and stack
/// limits), so a stale or foreign artifact is never picked up. A corrupt entry is recompiled
/// and overwritten. Entries are written to a temporary file and renamed into place, so
/// concurrent processes never read a half-written artifact.
///
/// Loading an artifact runs native code produced by a previous compilation: the directory must
/// be writable only by the user running rein (as `~/.cache` is).
#[derive(Debug, Clone)]
pub struct ArtifactCache {
    dir: PathBuf,
}

impl ArtifactCache {
    /// A cache in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The default location: `$REIN_CACHE_DIR`, else `$XDG_CACHE_HOME/rein/components`, else
    /// `~/.cache/rein/components`; `None` when none of these is set.
    pub fn default_location() -> Option<Self> {
        let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let dir = env("REIN_CACHE_DIR")
            .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("rein/components")))
            .or_else(|| env("HOME").map(|d| d.join(".cache/rein/components")))?;
        Some(Self::new(dir))
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn entry(&self, engine: &Engine, wasm: &[u8]) -> PathBuf {
        let mut hasher = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let wasm_hash = Sha256::digest(wasm);
        let hex: String = wasm_hash.iter().map(|b| format!("{b:02x}")).collect();
        self.dir.join(format!("{hex}-{:016x}.cwasm", hasher.finish()))
    }

    /// The compiled component for `wasm`: deserialized from the cache when present and valid,
    /// otherwise compiled and stored. Returns whether it was a cache hit.
    pub(crate) fn load_or_compile(&self, engine: &Engine, wasm: &[u8]) -> wasmtime::Result<(Component, bool)> {
        let path = self.entry(engine, wasm);
        if path.exists() {
            // SAFETY: the file was written by `Component::serialize` from these exact bytes on
            // an engine with the same compatibility hash (both are in its name), into a
            // directory only this user writes. wasmtime checks the header and version again.
            if let Ok(component) = unsafe { Component::deserialize_file(engine, &path) } {
                return Ok((component, true));
            }
        }
        let component = Component::new(engine, wasm)?;
        // A cache that cannot be written only costs speed, so write failures are ignored.
        let _ = self.store(&path, &component.serialize()?);
        Ok((component, false))
    }

    fn store(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path)
    }
}

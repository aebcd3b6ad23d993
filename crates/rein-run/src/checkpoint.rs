//! Crash-safe training checkpoints: everything a training loop needs to continue exactly where
//! it stopped, in one self-checking file per checkpoint.
//!
//! A checkpoint is `<run>/checkpoints/step-<NNNNNNNN>.ckpt`:
//!
//! ```text
//! "REINCKPT" | format u32 | step u64 | sections u32 | (name u32+bytes, data u64+bytes)* | SHA-256 of all before
//! ```
//!
//! Sections are opaque to this module: the loops store their counters, RNG states and
//! normalisers as JSON (`state`) and burn records of the model and optimiser. Files are written
//! atomically (temporary file, fsync, rename, fsync of the directory) so a kill at any moment
//! leaves either the old set or the new one; the newest [`KEEP`] are kept. Reading verifies the
//! checksum and falls back to an older checkpoint when the newest is corrupt or truncated,
//! reporting what it skipped.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use burn::module::Module;
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"REINCKPT";
const FORMAT: u32 = 1;
const DIGEST_LEN: usize = 32;

/// How many checkpoints a run keeps (the newest; older ones are deleted).
pub const KEEP: usize = 2;

/// Why a checkpoint cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file cannot be read or written.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is damaged: wrong magic, truncated, or its checksum does not match.
    #[error("checkpoint {path} is corrupt: {why}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The file is intact but does not fit this run (a missing section, another model).
    #[error("checkpoint {path}: {why}")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What does not fit.
        why: String,
    },
}

/// One checkpoint, read back.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    /// The file it came from.
    pub path: PathBuf,
    /// The training step (or PPO update) it was taken after, counted through the whole run
    /// (a GRPO step after SFT counts the SFT steps too; see [`Checkpointing::step_offset`]).
    pub step: u64,
    sections: Vec<(String, Vec<u8>)>,
}

impl Checkpoint {
    /// A section's bytes.
    pub fn section(&self, name: &str) -> Result<&[u8], CheckpointError> {
        self.sections
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, data)| data.as_slice())
            .ok_or_else(|| self.mismatch(format!("no `{name}` section")))
    }

    /// The `state` section, deserialised from JSON.
    pub fn state<T: serde::de::DeserializeOwned>(&self) -> Result<T, CheckpointError> {
        self.section_json("state")
    }

    /// Section `name`, deserialised from JSON.
    pub fn section_json<T: serde::de::DeserializeOwned>(&self, name: &str) -> Result<T, CheckpointError> {
        serde_json::from_slice(self.section(name)?).map_err(|e| self.mismatch(format!("{name}: {e}")))
    }

    /// How much of `metrics.jsonl` the run had written when this checkpoint was taken (every
    /// loop's `state` has a `metrics_len`).
    pub fn metrics_len(&self) -> Result<u64, CheckpointError> {
        #[derive(serde::Deserialize)]
        struct Logged {
            metrics_len: u64,
        }
        Ok(self.state::<Logged>()?.metrics_len)
    }

    /// `module` with the parameters stored in section `name`.
    pub fn load_module<B: Backend, M: Module<B>>(
        &self,
        name: &str,
        module: M,
        device: &B::Device,
    ) -> Result<M, CheckpointError> {
        let record = NamedMpkBytesRecorder::<FullPrecisionSettings>::new()
            .load(self.section(name)?.to_vec(), device)
            .map_err(|e| self.mismatch(format!("{name}: {e}")))?;
        Ok(module.load_record(record))
    }

    /// `optimizer` with the state stored in section `name`.
    pub fn load_optimizer<B, M, O>(&self, name: &str, optimizer: O, device: &B::Device) -> Result<O, CheckpointError>
    where
        B: AutodiffBackend,
        M: burn::module::AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let record = NamedMpkBytesRecorder::<FullPrecisionSettings>::new()
            .load(self.section(name)?.to_vec(), device)
            .map_err(|e| self.mismatch(format!("{name}: {e}")))?;
        Ok(optimizer.load_record(record))
    }

    /// What [`learner_sections`] wrote: the loop's `state`, `model` loaded into `model`,
    /// `optimizer` into `optimizer`.
    pub fn load_learner<B, M, O, S>(
        &self,
        model: M,
        optimizer: O,
        device: &B::Device,
    ) -> Result<(S, M, O), CheckpointError>
    where
        B: AutodiffBackend,
        M: burn::module::AutodiffModule<B>,
        O: Optimizer<M, B>,
        S: serde::de::DeserializeOwned,
    {
        Ok((
            self.state()?,
            self.load_module("model", model, device)?,
            self.load_optimizer::<B, M, O>("optimizer", optimizer, device)?,
        ))
    }

    /// What [`module_sections`] wrote under `names`: `model` and `optimizer` loaded from them.
    pub fn load_module_sections<B, M, O>(
        &self,
        [module, optim]: [&str; 2],
        model: M,
        optimizer: O,
        device: &B::Device,
    ) -> Result<(M, O), CheckpointError>
    where
        B: AutodiffBackend,
        M: burn::module::AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        Ok((
            self.load_module(module, model, device)?,
            self.load_optimizer::<B, M, O>(optim, optimizer, device)?,
        ))
    }

    /// The error saying this checkpoint does not fit the run, and why.
    pub fn mismatch(&self, why: String) -> CheckpointError {
        CheckpointError::Mismatch {
            path: self.path.clone(),
            why,
        }
    }
}

/// The parameters of `module` as a section.
pub fn module_bytes<B: Backend, M: Module<B>>(module: &M) -> Vec<u8> {
    NamedMpkBytesRecorder::<FullPrecisionSettings>::new()
        .record(module.clone().into_record(), ())
        .expect("MessagePack encoding of a module record does not fail")
}

/// The state of `optimizer` as a section.
fn optimizer_bytes<B, M, O>(optimizer: &O) -> Vec<u8>
where
    B: AutodiffBackend,
    M: burn::module::AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    NamedMpkBytesRecorder::<FullPrecisionSettings>::new()
        .record(optimizer.to_record(), ())
        .expect("MessagePack encoding of an optimizer record does not fail")
}

/// The sections of a trainer of one burn module: its loop `state` (JSON), the `model` and the
/// `optimizer` (read back with [`Checkpoint::load_learner`]).
pub fn learner_sections<B, M, O, S>(state: &S, model: &M, optimizer: &O) -> Vec<(String, Vec<u8>)>
where
    B: AutodiffBackend,
    M: burn::module::AutodiffModule<B>,
    O: Optimizer<M, B>,
    S: serde::Serialize,
{
    vec![
        ("state".into(), serde_json::to_vec(state).expect("the state serialises")),
        ("model".into(), module_bytes(model)),
        ("optimizer".into(), optimizer_bytes::<B, M, O>(optimizer)),
    ]
}

/// A second module and its optimiser as the sections named `names` (a critic beside the
/// policy), read back with [`Checkpoint::load_module`] and [`Checkpoint::load_optimizer`].
pub fn module_sections<B, M, O>(names: [&str; 2], model: &M, optimizer: &O) -> Vec<(String, Vec<u8>)>
where
    B: AutodiffBackend,
    M: burn::module::AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    vec![
        (names[0].into(), module_bytes(model)),
        (names[1].into(), optimizer_bytes::<B, M, O>(optimizer)),
    ]
}

/// A run's checkpoint directory.
#[derive(Debug, Clone)]
pub struct CheckpointDir {
    dir: PathBuf,
}

/// A checkpoint skipped while looking for the newest usable one.
pub type Skipped = CheckpointError;

impl CheckpointDir {
    /// `<run>/checkpoints`.
    pub fn of_run(run: &Path) -> Self {
        Self {
            dir: run.join("checkpoints"),
        }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The run directory it belongs to (what `--resume` takes).
    pub fn run(&self) -> &Path {
        self.dir.parent().unwrap_or(&self.dir)
    }

    /// Writes a checkpoint for `step` atomically, then deletes all but the newest [`KEEP`].
    pub fn save(&self, step: u64, sections: &[(&str, &[u8])]) -> Result<PathBuf, CheckpointError> {
        let path = self.dir.join(format!("step-{step:08}.ckpt"));
        let io = |source| CheckpointError::Io {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        let bytes = encode(step, sections);
        let temp = self.dir.join(format!(".step-{step:08}.ckpt.partial"));
        let write = || -> std::io::Result<()> {
            let mut file = File::create(&temp)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            std::fs::rename(&temp, &path)?;
            // The rename is durable once the directory entry is.
            File::open(&self.dir)?.sync_all()
        };
        write().map_err(io)?;
        for (_, old) in self.files().map_err(io)?.into_iter().rev().skip(KEEP) {
            let _ = std::fs::remove_file(old);
        }
        Ok(path)
    }

    /// The newest checkpoint that reads back intact, and the newer ones that did not (corrupt
    /// or truncated files, each with its reason). `None` when there is no usable checkpoint.
    pub fn latest(&self) -> Result<(Option<Checkpoint>, Vec<Skipped>), CheckpointError> {
        let files = self.files().map_err(|source| CheckpointError::Io {
            path: self.dir.clone(),
            source,
        })?;
        let mut skipped = Vec::new();
        for (_, path) in files.into_iter().rev() {
            match read(&path) {
                Ok(checkpoint) => return Ok((Some(checkpoint), skipped)),
                Err(e) => skipped.push(e),
            }
        }
        Ok((None, skipped))
    }

    /// Complete checkpoint files, oldest first (partial writes are ignored).
    fn files(&self) -> std::io::Result<Vec<(u64, PathBuf)>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut files = Vec::new();
        for entry in entries {
            let path = entry?.path();
            let step = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("step-")?.strip_suffix(".ckpt")?.parse::<u64>().ok());
            if let Some(step) = step {
                files.push((step, path));
            }
        }
        files.sort();
        Ok(files)
    }
}

fn encode(step: u64, sections: &[(&str, &[u8])]) -> Vec<u8> {
    let size: usize = sections.iter().map(|(n, d)| 12 + n.len() + d.len()).sum();
    let mut out = Vec::with_capacity(24 + size + DIGEST_LEN);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&step.to_le_bytes());
    out.extend_from_slice(&(sections.len() as u32).to_le_bytes());
    for (name, data) in sections {
        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        out.extend_from_slice(data);
    }
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    out
}

/// Reads and verifies one checkpoint file.
pub fn read(path: &Path) -> Result<Checkpoint, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let corrupt = |why: &str| CheckpointError::Corrupt {
        path: path.to_path_buf(),
        why: why.into(),
    };
    if bytes.len() < MAGIC.len() + 16 + DIGEST_LEN || &bytes[..MAGIC.len()] != MAGIC {
        return Err(corrupt("not a rein checkpoint, or truncated"));
    }
    let (body, digest) = bytes.split_at(bytes.len() - DIGEST_LEN);
    if Sha256::digest(body).as_slice() != digest {
        return Err(corrupt("checksum mismatch (truncated or damaged)"));
    }
    let mut reader = Reader { bytes: body, at: 8 };
    let format = reader.u32().ok_or_else(|| corrupt("truncated header"))?;
    if format != FORMAT {
        return Err(corrupt(&format!(
            "format version {format}, this build reads version {FORMAT}"
        )));
    }
    let step = reader.u64().ok_or_else(|| corrupt("truncated header"))?;
    let count = reader.u32().ok_or_else(|| corrupt("truncated header"))?;
    let mut sections = Vec::new();
    for _ in 0..count {
        let section = (|| {
            let name_len = reader.u32()? as usize;
            let name = String::from_utf8(reader.take(name_len)?.to_vec()).ok()?;
            let len = usize::try_from(reader.u64()?).ok()?;
            Some((name, reader.take(len)?.to_vec()))
        })();
        sections.push(section.ok_or_else(|| corrupt("a section runs past the end"))?);
    }
    if reader.at != body.len() {
        return Err(corrupt("bytes after the last section"));
    }
    Ok(Checkpoint {
        path: path.to_path_buf(),
        step,
        sections,
    })
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.bytes.len())?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Some(out)
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

static STOP_REQUESTED: AtomicBool = AtomicBool::new(false);

/// Asks running training loops to write a checkpoint after the current step and stop with
/// `RunError::Interrupted` (the CLI calls this on Ctrl-C).
pub fn request_stop() {
    STOP_REQUESTED.store(true, Ordering::SeqCst);
}

/// Whether [`request_stop`] was called.
pub fn stop_requested() -> bool {
    STOP_REQUESTED.load(Ordering::SeqCst)
}

/// How a training loop checkpoints: where, how often, and what it resumes from.
#[derive(Debug, Clone, Default)]
pub struct Checkpointing {
    /// Where checkpoints go; `None` when the run writes no directory.
    pub dir: Option<CheckpointDir>,
    /// Every how many steps (or updates); 0 = only when stopped.
    pub every: usize,
    /// Steps of the run's earlier stages: a checkpoint after this stage's step `s` is numbered
    /// `step_offset + s`, so checkpoint numbers grow through the whole run (SFT, then GRPO).
    pub step_offset: usize,
    /// The checkpoint to continue from.
    pub resume: Option<Checkpoint>,
    /// Sections written into every checkpoint besides the loop's own: what the code around the
    /// loop needs to resume (which stage of a run, results of earlier stages).
    pub context: Vec<(String, Vec<u8>)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rein-ckpt-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn round_trip_and_only_the_newest_are_kept() {
        let run = temp_dir("keep");
        let dir = CheckpointDir::of_run(&run);
        for step in 1..=4u64 {
            let data = vec![step as u8; 100 * step as usize];
            dir.save(step, &[("state", b"{}"), ("model", &data)]).unwrap();
        }
        let (latest, skipped) = dir.latest().unwrap();
        let latest = latest.unwrap();
        assert!(skipped.is_empty());
        assert_eq!(latest.step, 4);
        assert_eq!(latest.section("model").unwrap(), vec![4u8; 400].as_slice());
        assert_eq!(dir.files().unwrap().len(), KEEP);
        assert!(matches!(
            latest.section("optimizer"),
            Err(CheckpointError::Mismatch { .. })
        ));
        std::fs::remove_dir_all(run).unwrap();
    }

    #[test]
    fn corrupt_and_truncated_files_fall_back_to_an_older_checkpoint() {
        let run = temp_dir("corrupt");
        let dir = CheckpointDir::of_run(&run);
        for step in [10u64, 20] {
            dir.save(step, &[("state", format!("{{\"step\":{step}}}").as_bytes())])
                .unwrap();
        }
        let newest = dir.path().join("step-00000020.ckpt");
        let mut bytes = std::fs::read(&newest).unwrap();
        bytes[30] ^= 0x40;
        std::fs::write(&newest, &bytes).unwrap();
        let (latest, skipped) = dir.latest().unwrap();
        assert_eq!(latest.unwrap().step, 10);
        assert_eq!(skipped.len(), 1);
        assert!(
            skipped[0]
                .to_string()
                .contains("step-00000020.ckpt is corrupt: checksum mismatch")
        );

        // Truncation at every length is detected.
        let good = std::fs::read(dir.path().join("step-00000010.ckpt")).unwrap();
        for len in 0..good.len() {
            std::fs::write(&newest, &good[..len]).unwrap();
            assert!(
                matches!(read(&newest), Err(CheckpointError::Corrupt { .. })),
                "length {len}"
            );
        }
        // A partial write (killed before the rename) is not a checkpoint.
        std::fs::write(dir.path().join(".step-00000030.ckpt.partial"), &good[..10]).unwrap();
        assert_eq!(dir.latest().unwrap().0.unwrap().step, 10);
        std::fs::remove_dir_all(run).unwrap();
    }

    #[test]
    fn no_directory_means_no_checkpoint() {
        let dir = CheckpointDir::of_run(&temp_dir("none"));
        let (latest, skipped) = dir.latest().unwrap();
        assert!(latest.is_none() && skipped.is_empty());
    }
}

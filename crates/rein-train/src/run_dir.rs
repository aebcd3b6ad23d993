//! Run directories: `runs/<name>-<UTC timestamp>/` holding the resolved recipe, the metrics
//! and the trained model.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// One run's directory.
#[derive(Debug, Clone)]
pub struct RunDir {
    path: PathBuf,
}

impl RunDir {
    /// Creates `<runs_dir>/<name>-<YYYYmmdd-HHMMSS>` (with a numeric suffix if it exists) and
    /// writes the resolved recipe into it as `recipe.toml`.
    pub fn create(runs_dir: &Path, name: &str, recipe_toml: &str) -> std::io::Result<Self> {
        std::fs::create_dir_all(runs_dir)?;
        let stamp = jiff::Timestamp::now().strftime("%Y%m%d-%H%M%S");
        let base = runs_dir.join(format!("{name}-{stamp}"));
        let mut path = base.clone();
        let mut n = 1;
        while let Err(e) = std::fs::create_dir(&path) {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(e);
            }
            n += 1;
            path = PathBuf::from(format!("{}-{n}", base.display()));
        }
        std::fs::write(path.join("recipe.toml"), recipe_toml)?;
        Ok(Self { path })
    }

    /// An existing run directory, to resume: it must hold the `recipe.toml` a run writes.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        if !path.join("recipe.toml").is_file() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{} is not a run directory (no recipe.toml)", path.display()),
            ));
        }
        Ok(Self {
            path: path.to_path_buf(),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The resolved recipe the run was started with.
    pub fn recipe_toml(&self) -> std::io::Result<String> {
        std::fs::read_to_string(self.path.join("recipe.toml"))
    }

    /// A writer for `metrics.jsonl`, which starts empty.
    pub fn metrics(&self) -> std::io::Result<MetricsWriter> {
        self.metrics_from(0)
    }

    /// A writer for `metrics.jsonl` that keeps its first `len` bytes (what a checkpoint had
    /// logged) and drops anything written after them.
    pub fn metrics_from(&self, len: u64) -> std::io::Result<MetricsWriter> {
        let path = self.path.join("metrics.jsonl");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        let on_disk = file.metadata()?.len();
        if on_disk < len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("{} has {on_disk} bytes but the checkpoint logged {len}", path.display()),
            ));
        }
        file.set_len(len)?;
        let mut out = BufWriter::new(file);
        std::io::Seek::seek(&mut out, std::io::SeekFrom::Start(len))?;
        Ok(MetricsWriter { out, len })
    }
}

/// Appends one JSON object per line, flushed after each so a crash loses nothing written.
pub struct MetricsWriter {
    out: BufWriter<File>,
    len: u64,
}

impl MetricsWriter {
    /// Writes one record.
    pub fn write(&mut self, record: &serde_json::Value) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        self.out.write_all(&line)?;
        self.out.flush()?;
        self.len += line.len() as u64;
        Ok(())
    }

    /// Bytes written so far (what a checkpoint records, to cut the file back on resume).
    pub fn bytes_written(&self) -> u64 {
        self.len
    }
}

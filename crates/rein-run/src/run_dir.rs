//! Run directories: `runs/<name>-<UTC timestamp>/` holding the resolved recipe, the metrics
//! (`metrics.jsonl`, and TensorBoard's event files under `tb/`) and the trained model.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::tensorboard::EventWriter;

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

    /// A writer for `metrics.jsonl` alone, which starts empty.
    pub fn metrics(&self) -> std::io::Result<MetricsWriter> {
        self.metrics_from(0, false)
    }

    /// A writer for `metrics.jsonl` that keeps its first `len` bytes (what a checkpoint had
    /// logged) and drops anything written after them; with `tensorboard`, also for event files
    /// under `tb/` (see [`MetricsWriter`]).
    pub fn metrics_from(&self, len: u64, tensorboard: bool) -> std::io::Result<MetricsWriter> {
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
        let tensorboard = match tensorboard {
            false => None,
            true => {
                let mut tb = Tensorboard {
                    dir: self.path.join("tb"),
                    writers: BTreeMap::new(),
                };
                if len == 0 {
                    tb.writer(None, None)?
                        .text(0, "recipe", &markdown_code(&self.recipe_toml()?))?;
                }
                Some(tb)
            }
        };
        Ok(MetricsWriter {
            out,
            len,
            tensorboard,
            dir: self.path.clone(),
        })
    }
}

/// Appends one JSON object per line to `metrics.jsonl`, flushed after each so a crash loses
/// nothing written, and, when asked, its numbers as TensorBoard scalars: a record of stage `s`
/// goes to `tb/s/` (a stageless run's to `tb/`) at its `global_step`, `step` or `update`, so
/// each stage is a run of its own in TensorBoard, with its own steps. The recipe and the report
/// are texts in `tb/`. Each process opens a new event file per stage, starting with a
/// `SessionLog` START at its first record's step, so that after a resume TensorBoard drops what
/// the interrupted process wrote from there on.
pub struct MetricsWriter {
    out: BufWriter<File>,
    len: u64,
    tensorboard: Option<Tensorboard>,
    /// The run directory.
    dir: PathBuf,
}

/// The event files of a run, one writer per stage.
struct Tensorboard {
    dir: PathBuf,
    writers: BTreeMap<Option<String>, EventWriter>,
}

impl Tensorboard {
    /// The writer of `stage`'s directory, created on first use; when that use writes the record
    /// of step `first` (`None` for a text), its file starts with a `SessionLog` START there.
    /// TensorBoard's server takes a run's first START as its start and each later one (a
    /// resumed process's) as a restart that drops the events from its step on. A text never
    /// starts a file with a START: the recipe the first process wrote stays.
    fn writer(&mut self, stage: Option<&str>, first: Option<u64>) -> std::io::Result<&mut EventWriter> {
        let key = stage.map(str::to_string);
        if !self.writers.contains_key(&key) {
            let dir = match stage {
                Some(stage) => self.dir.join(stage),
                None => self.dir.clone(),
            };
            let mut writer = EventWriter::create(&dir)?;
            if let Some(step) = first {
                writer.session_start(step)?;
            }
            self.writers.insert(key.clone(), writer);
        }
        Ok(self.writers.get_mut(&key).expect("inserted above"))
    }
}

/// The keys that place a record, not plotted: its stage, when and the step axes.
const POSITION_KEYS: [&str; 5] = ["stage", "when", "step", "update", "global_step"];

/// TensorBoard tags under TRL's names where rein's metric means what TRL's does.
const TRL_NAMES: [(&str, &str); 2] = [
    ("train/clip_frac", "train/clip_ratio"),
    ("train/completion_length", "train/completions/mean_length"),
];

/// The TensorBoard tag of metric `key`.
pub fn tensorboard_tag(key: &str) -> &str {
    TRL_NAMES
        .iter()
        .find(|(ours, _)| *ours == key)
        .map_or(key, |(_, trl)| trl)
}

/// `text` as a markdown code block (how TensorBoard's text plugin shows a file verbatim).
fn markdown_code(text: &str) -> String {
    format!("```\n{text}\n```")
}

impl MetricsWriter {
    /// The run directory written to.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes one record.
    pub fn write(&mut self, record: &serde_json::Value) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        self.out.write_all(&line)?;
        self.out.flush()?;
        self.len += line.len() as u64;
        if let Some(tb) = self.tensorboard.as_mut() {
            let step = ["global_step", "step", "update"]
                .iter()
                .find_map(|key| record[key].as_u64())
                .unwrap_or(0);
            let scalars: Vec<(&str, f32)> = (record.as_object().into_iter().flatten())
                .filter(|(key, _)| !POSITION_KEYS.contains(&key.as_str()))
                .filter_map(|(key, value)| Some((tensorboard_tag(key), value.as_f64()? as f32)))
                .collect();
            tb.writer(record["stage"].as_str(), Some(step))?
                .scalars(step, scalars)?;
        }
        Ok(())
    }

    /// A text (markdown) in `tb/` under `tag` (the run's report), when writing event files.
    pub fn text(&mut self, tag: &str, text: &str) -> std::io::Result<()> {
        match self.tensorboard.as_mut() {
            Some(tb) => tb.writer(None, None)?.text(0, tag, text),
            None => Ok(()),
        }
    }

    /// Bytes written so far (what a checkpoint records, to cut the file back on resume).
    pub fn bytes_written(&self) -> u64 {
        self.len
    }
}

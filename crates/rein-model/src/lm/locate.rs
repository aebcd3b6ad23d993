//! Where a model named in a recipe or on the command line lives: a checkpoint directory, a
//! `.gguf` file (converted once), or the name of a model fetched with `cargo xtask model NAME`.

use std::path::{Path, PathBuf};

use super::LoadError;

/// Where named models are: `$REIN_MODEL_DIR`, else `$CARGO_TARGET_DIR/models`, else
/// `target/models` (what `cargo xtask model NAME` fills).
pub fn model_dir() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    var("REIN_MODEL_DIR")
        .or_else(|| var("CARGO_TARGET_DIR").map(|t| t.join("models")))
        .unwrap_or_else(|| PathBuf::from("target/models"))
}

/// The checkpoint directory for `path`: the directory itself; a `.gguf` file's conversion; or,
/// for a bare name that is not a path (`smollm2-135m`), that model in [`model_dir`].
pub fn locate(path: &Path) -> Result<PathBuf, LoadError> {
    let bare_name = path.components().count() == 1;
    if !path.exists() && bare_name {
        let named = model_dir().join(path);
        if named.is_dir() {
            return Ok(named);
        }
        let fetched: Vec<String> = std::fs::read_dir(model_dir())
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.path().join("config.json").is_file())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        return Err(LoadError::Io {
            path: path.to_path_buf(),
            reason: format!(
                "no such directory or file, and no model of that name in {} (fetched: {}); \
                 fetch it with `cargo xtask model {}`",
                model_dir().display(),
                if fetched.is_empty() {
                    "none".into()
                } else {
                    fetched.join(", ")
                },
                path.display()
            ),
        });
    }
    Ok(rein_gguf::checkpoint_dir(path)?)
}

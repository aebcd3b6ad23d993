//! Reading a model directory's files, errors naming the file: its bytes ([`read`]) and its JSON
//! ([`read_json`]). Nothing here knows a model, so image processors read their settings
//! without depending on the decoder.

use std::path::Path;

use super::LoadError;

/// The file `path`'s bytes; errors name it.
pub(crate) fn read(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|e| LoadError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// The JSON file `path`, parsed; errors name it.
pub(crate) fn read_json(path: &Path) -> Result<serde_json::Value, LoadError> {
    serde_json::from_slice(&read(path)?).map_err(|e| LoadError::Json {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

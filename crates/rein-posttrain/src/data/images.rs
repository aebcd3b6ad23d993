//! A dataset row's images, as TRL's and verl's multimodal datasets hold them: a list of paths
//! (relative to the data file), or of Hugging Face `Image` values — `{"path", "bytes"}` objects,
//! the bytes base64 as Parquet rows are read here. Nothing is decoded on reading: an image is
//! read and bounded where a model processes it.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where one image of a row is.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageSource {
    /// A file.
    Path(PathBuf),
    /// The encoded image itself.
    Bytes(#[serde(with = "base64_bytes")] Vec<u8>),
}

impl ImageSource {
    /// The encoded image: the file's bytes (at most `max_bytes`, checked before reading), or
    /// the bytes held.
    pub fn bytes(&self, max_bytes: usize) -> Result<Vec<u8>, String> {
        match self {
            Self::Bytes(bytes) if bytes.len() > max_bytes => Err(format!(
                "an image of {} bytes, over the limit of {max_bytes} bytes",
                bytes.len()
            )),
            Self::Bytes(bytes) => Ok(bytes.clone()),
            Self::Path(path) => {
                let size = std::fs::metadata(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?
                    .len();
                if size > max_bytes as u64 {
                    return Err(format!(
                        "{}: {size} bytes, over the limit of {max_bytes} bytes",
                        path.display()
                    ));
                }
                std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
            }
        }
    }
}

/// The images of a row's `value` (`null` for none), paths resolved against `dir`.
pub fn row_images(value: Value, dir: &Path) -> Result<Vec<ImageSource>, String> {
    let items = match value {
        Value::Null => return Ok(Vec::new()),
        Value::Array(items) => items,
        // One image on its own.
        single => vec![single],
    };
    items.into_iter().map(|item| image(item, dir)).collect()
}

fn image(item: Value, dir: &Path) -> Result<ImageSource, String> {
    match item {
        Value::String(path) => Ok(ImageSource::Path(dir.join(path))),
        Value::Object(mut map) => match (map.remove("bytes"), map.remove("path")) {
            (Some(Value::String(bytes)), _) => (base64::engine::general_purpose::STANDARD.decode(bytes.trim()))
                .map(ImageSource::Bytes)
                .map_err(|e| format!("an image's `bytes` are not base64: {e}")),
            (None | Some(Value::Null), Some(Value::String(path))) => Ok(ImageSource::Path(dir.join(path))),
            _ => Err("an image object needs `bytes` (base64) or `path`".into()),
        },
        other => Err(format!(
            "an image is a path or a {{\"path\", \"bytes\"}} object, not {other}"
        )),
    }
}

mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(deserializer)?;
        (base64::engine::general_purpose::STANDARD.decode(text)).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_objects_and_bytes_are_read_and_the_rest_refused() {
        let dir = Path::new("/data");
        let images = row_images(
            serde_json::json!(["a.png", {"path": "b.png", "bytes": null}, {"bytes": "aGk=", "path": "c.png"}]),
            dir,
        )
        .unwrap();
        assert_eq!(
            images,
            [
                ImageSource::Path(dir.join("a.png")),
                ImageSource::Path(dir.join("b.png")),
                ImageSource::Bytes(b"hi".to_vec())
            ]
        );
        assert_eq!(row_images(Value::Null, dir).unwrap(), []);
        assert!(row_images(serde_json::json!([3]), dir).unwrap_err().contains("not 3"));
        assert!(
            row_images(serde_json::json!([{"bytes": "@@"}]), dir)
                .unwrap_err()
                .contains("not base64")
        );
        assert!(
            ImageSource::Bytes(vec![0; 10])
                .bytes(4)
                .unwrap_err()
                .contains("over the limit of 4 bytes")
        );
    }
}

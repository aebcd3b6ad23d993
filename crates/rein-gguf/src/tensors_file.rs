//! Writing `f32` tensors as a safetensors file whose bytes depend only on the tensors: names in
//! order, one metadata entry (a map with more would be written in a different order each run).

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::Dtype;
use safetensors::tensor::TensorView;

/// Named tensors: shape and row-major values.
pub type Tensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// Writes `tensors` to `path` with the metadata `{"format": format}`.
pub fn write(path: &Path, tensors: &Tensors, format: &str) -> std::io::Result<()> {
    let bytes: Vec<(&String, &Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(name, (shape, values))| (name, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect()))
        .collect();
    let views = bytes
        .iter()
        .map(|(name, shape, data)| {
            let view = TensorView::new(Dtype::F32, shape.to_vec(), data)
                .map_err(|e| std::io::Error::other(format!("tensor `{name}`: {e}")))?;
            Ok((name.as_str(), view))
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let metadata = Some(std::collections::HashMap::from([(
        "format".to_string(),
        format.to_string(),
    )]));
    safetensors::serialize_to_file(views, metadata, path)
        .map_err(|e| std::io::Error::other(format!("writing {}: {e}", path.display())))
}

//! `model.packed.safetensors`: a quantised model's weight matrices as they were stored (integer
//! codes with block scales, [`PackedMatrix`]) beside the `f32` checkpoint converted from them.
//! The checkpoint is what every tool reads; this file only lets rein's products read a
//! fraction of the bytes for the same values (see `rein_model::lm::PackedWeights`).
//!
//! Each matrix `name` (a Hugging Face weight name; the head under `lm_head.weight` even when
//! it is tied to the embeddings) is three tensors, in burn's `[in, out]` orientation:
//! `name.codes` (I8 `[in, out]`), `name.scales` (F32 `[in / block, out]`) and, when elements
//! have offsets, `name.offsets` (as the scales).

use std::collections::BTreeMap;
use std::path::Path;

use rein_kernels::PackedMatrix;
use safetensors::Dtype;
use safetensors::tensor::TensorView;

/// The file's name in a checkpoint directory.
pub const FILE: &str = "model.packed.safetensors";

/// Writes `matrices` to `path`.
pub fn write(path: &Path, matrices: &BTreeMap<String, PackedMatrix>) -> std::io::Result<()> {
    let mut tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, m) in matrices {
        let [rows, cols] = m.shape();
        let codes = m.codes().into_iter().map(|c| c as u8).collect();
        tensors.push((format!("{name}.codes"), Dtype::I8, vec![rows, cols], codes));
        let blocks = vec![rows / m.block(), cols];
        let floats = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        tensors.push((
            format!("{name}.scales"),
            Dtype::F32,
            blocks.clone(),
            floats(&m.scales()),
        ));
        if let Some(offsets) = m.offsets() {
            tensors.push((format!("{name}.offsets"), Dtype::F32, blocks, floats(&offsets)));
        }
    }
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            let view = TensorView::new(*dtype, shape.clone(), data)
                .map_err(|e| std::io::Error::other(format!("tensor `{name}`: {e}")))?;
            Ok((name.as_str(), view))
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, None, path)
        .map_err(|e| std::io::Error::other(format!("writing {}: {e}", path.display())))
}

/// Reads the matrices of `path`. Errors name the tensor (the caller names the file).
pub fn read(path: &Path) -> Result<BTreeMap<String, PackedMatrix>, String> {
    let fail = |reason: String| reason;
    let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    let file = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| fail(e.to_string()))?;
    let mut out = BTreeMap::new();
    for name in file.names() {
        let Some(matrix) = name.strip_suffix(".codes") else {
            continue;
        };
        let tensor = |suffix: &str, dtype: Dtype| -> Result<Option<TensorView<'_>>, String> {
            let key = format!("{matrix}.{suffix}");
            match file.tensor(&key) {
                Ok(view) if view.dtype() == dtype && view.shape().len() == 2 => Ok(Some(view)),
                Ok(view) => Err(fail(format!(
                    "tensor `{key}` is {:?} {:?}, expected a {dtype:?} matrix",
                    view.dtype(),
                    view.shape()
                ))),
                Err(_) => Ok(None),
            }
        };
        let missing = |suffix: &str| fail(format!("tensor `{matrix}.{suffix}` is missing"));
        let codes = tensor("codes", Dtype::I8)?.ok_or_else(|| missing("codes"))?;
        let scales = tensor("scales", Dtype::F32)?.ok_or_else(|| missing("scales"))?;
        let offsets = tensor("offsets", Dtype::F32)?;
        let floats = |view: &TensorView<'_>| -> Vec<f32> {
            view.data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        };
        let [rows, cols] = [codes.shape()[0], codes.shape()[1]];
        let scale_rows = scales.shape()[0];
        if scale_rows == 0 || !rows.is_multiple_of(scale_rows) {
            return Err(fail(format!(
                "tensor `{matrix}.scales` has {scale_rows} rows, which do not divide the {rows} rows of its codes"
            )));
        }
        let codes: Vec<i8> = codes.data().iter().map(|&b| b as i8).collect();
        let packed = PackedMatrix::new(
            [rows, cols],
            rows / scale_rows,
            &codes,
            floats(&scales),
            offsets.as_ref().map(floats),
        )
        .map_err(|e| fail(format!("`{matrix}`: {e}")))?;
        out.insert(matrix.to_string(), packed);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrices_round_trip() {
        let codes: Vec<i8> = (0..64 * 5).map(|i| (i % 16) as i8 - 8).collect();
        let scales: Vec<f32> = (0..2 * 5).map(|i| 0.5 + i as f32).collect();
        let plain = PackedMatrix::new([64, 5], 32, &codes, scales.clone(), None).unwrap();
        let wide: Vec<i8> = (0..64 * 5).map(|i| (i % 200) as i8).collect();
        let offsets = Some(scales.iter().map(|s| -s).collect());
        let offset = PackedMatrix::new([64, 5], 32, &wide, scales, offsets).unwrap();
        let matrices = BTreeMap::from([("a.weight".to_string(), plain), ("b.weight".to_string(), offset)]);
        let path = std::env::temp_dir().join(format!("rein-packed-{}.safetensors", std::process::id()));
        write(&path, &matrices).unwrap();
        assert_eq!(read(&path).unwrap(), matrices);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_tensor_without_its_scales_is_named() {
        let codes = [0u8; 4];
        let view = TensorView::new(Dtype::I8, vec![2, 2], &codes).unwrap();
        let path = std::env::temp_dir().join(format!("rein-packed-bad-{}.safetensors", std::process::id()));
        safetensors::serialize_to_file([("w.codes", view)], None, &path).unwrap();
        let err = read(&path).unwrap_err();
        assert!(err.contains("`w.scales` is missing"), "{err}");
        let _ = std::fs::remove_file(&path);
    }
}

//! The GGUF container: header, metadata, tensor directory and data, after ggml's `docs/gguf.md`.
//!
//! Every count and offset read from the file is checked against the bytes that are actually
//! there before anything is allocated, so a truncated or hostile file gets an error naming the
//! field, never a panic or a huge allocation.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::GgufError;
use super::quant::GgmlType;

/// `GGUF` read as a little-endian `u32`.
const MAGIC: &[u8; 4] = b"GGUF";
/// Tensor data starts at a multiple of this unless `general.alignment` says otherwise.
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `uint8` … `uint64`.
    Unsigned(u64),
    /// `int8` … `int64`.
    Signed(i64),
    /// `float32`, `float64`.
    Float(f64),
    /// `bool`.
    Bool(bool),
    /// `string` (UTF-8).
    String(String),
    /// `array` of one element type.
    Array(Vec<Value>),
}

impl Value {
    /// As an unsigned integer, when it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::Unsigned(v) => Some(v),
            Value::Signed(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// As a float, when it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Float(v) => Some(v),
            Value::Unsigned(v) => Some(v as f64),
            Value::Signed(v) => Some(v as f64),
            _ => None,
        }
    }

    /// As a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// As an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(v) => Some(v),
            _ => None,
        }
    }
}

/// One entry of the tensor directory.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` varies fastest (a `[out, in]` matrix is `[in, out]`).
    pub dims: Vec<usize>,
    /// How the elements are stored.
    pub kind: GgmlType,
    /// Byte range of the data within the file.
    pub bytes: std::ops::Range<usize>,
}

impl TensorInfo {
    /// The shape in row-major order (PyTorch's / safetensors' order): `dims` reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }
}

/// A parsed GGUF file, its bytes held in memory.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata by key.
    pub metadata: BTreeMap<String, Value>,
    /// The tensor directory, in file order.
    pub tensors: Vec<TensorInfo>,
    bytes: Vec<u8>,
}

/// A tensor's entry in the file's directory: name, dimensions, type and data offset.
struct DirectoryEntry {
    name: String,
    dims: Vec<usize>,
    kind: GgmlType,
    offset: u64,
}

impl DirectoryEntry {
    /// The tensor's place in the file, once its size is checked against the file's length.
    fn locate(self, data_start: u64, file_len: usize, path: &Path) -> Result<TensorInfo, GgufError> {
        let Self {
            name,
            dims,
            kind,
            offset,
        } = self;
        let elements = dims
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| tensor_error(path, &name, format!("{dims:?} elements overflow")))?;
        if !dims[0].is_multiple_of(kind.block_size()) {
            return Err(tensor_error(
                path,
                &name,
                format!(
                    "rows of {} elements are not whole {} blocks of {}",
                    dims[0],
                    kind.name(),
                    kind.block_size()
                ),
            ));
        }
        let size = elements / kind.block_size() * kind.block_bytes();
        let start = data_start
            .checked_add(offset)
            .and_then(|s| usize::try_from(s).ok())
            .filter(|s| s.checked_add(size).is_some_and(|end| end <= file_len))
            .ok_or_else(|| {
                tensor_error(
                    path,
                    &name,
                    format!("data at offset {offset} ({size} bytes) lies outside the file ({file_len} bytes)"),
                )
            })?;
        Ok(TensorInfo {
            name,
            dims,
            kind,
            bytes: start..start + size,
        })
    }
}

/// `general.alignment`, or the default: where tensor data starts and is padded to.
fn alignment(metadata: &BTreeMap<String, Value>, path: &Path) -> Result<u64, GgufError> {
    match metadata.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() => Ok(a),
            _ => Err(GgufError::Metadata {
                path: path.to_path_buf(),
                key: "general.alignment".into(),
                reason: format!("{v:?} is not a power of two"),
            }),
        },
    }
}

impl GgufFile {
    /// Reads and parses `path`.
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let bytes = std::fs::read(path).map_err(|e| GgufError::Io {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Self::parse(bytes, path)
    }

    /// Parses a GGUF file's `bytes`; `path` names it in errors.
    pub fn parse(bytes: Vec<u8>, path: &Path) -> Result<Self, GgufError> {
        let mut r = Reader {
            bytes: &bytes,
            at: 0,
            path,
        };
        if r.take(4, "magic")? != MAGIC {
            return Err(r.format("does not start with `GGUF`"));
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(r.format(format!("version {version} is not supported (2 and 3 are)")));
        }
        let tensor_count = r.u64("tensor_count")?;
        let kv_count = r.u64("metadata_kv_count")?;
        let mut metadata = BTreeMap::new();
        for i in 0..kv_count {
            let key = r.string(&format!("metadata key #{i}"))?;
            let kind = r.u32(&key)?;
            let value = r.value(kind, &key, 0)?;
            metadata.insert(key, value);
        }
        let directory = (0..tensor_count)
            .map(|i| r.directory_entry(i))
            .collect::<Result<Vec<_>, _>>()?;
        let alignment = alignment(&metadata, path)?;
        let data_start = (r.at as u64).div_ceil(alignment) * alignment;
        let tensors = (directory.into_iter())
            .map(|entry| entry.locate(data_start, bytes.len(), path))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            bytes,
        })
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The stored bytes of `tensor`.
    pub fn data(&self, tensor: &TensorInfo) -> &[u8] {
        &self.bytes[tensor.bytes.clone()]
    }

    /// `tensor`'s elements as f32, row-major (in the order of [`TensorInfo::shape`]).
    pub fn dequantize(&self, tensor: &TensorInfo) -> Vec<f32> {
        tensor.kind.dequantize(self.data(tensor))
    }

    /// The metadata value at `key`, or an error naming the key.
    pub fn get(&self, key: &str) -> Result<&Value, GgufError> {
        self.metadata
            .get(key)
            .ok_or_else(|| self.metadata_error(key, "missing"))
    }

    /// An unsigned integer at `key`.
    pub fn get_usize(&self, key: &str) -> Result<usize, GgufError> {
        let value = self.get(key)?;
        value
            .as_u64()
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| self.metadata_error(key, format!("expected an unsigned integer, found {value:?}")))
    }

    /// The unsigned integer at `key`, or `None` when the key is absent.
    pub fn optional_usize(&self, key: &str) -> Result<Option<usize>, GgufError> {
        self.metadata.get(key).map(|_| self.get_usize(key)).transpose()
    }

    /// The string at `key`, or `None` when the key is absent.
    pub fn optional_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.metadata.get(key).map(|_| self.get_str(key)).transpose()
    }

    /// A string at `key`.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let value = self.get(key)?;
        value
            .as_str()
            .ok_or_else(|| self.metadata_error(key, format!("expected a string, found {}", short(value))))
    }

    /// An error about the metadata at `key`.
    pub fn metadata_error(&self, key: &str, reason: impl Into<String>) -> GgufError {
        GgufError::Metadata {
            path: self.path.clone(),
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// An error about the tensor `name`.
    pub fn tensor_error(&self, name: &str, reason: impl Into<String>) -> GgufError {
        tensor_error(&self.path, name, reason)
    }
}

fn tensor_error(path: &Path, name: &str, reason: impl Into<String>) -> GgufError {
    GgufError::Tensor {
        path: path.to_path_buf(),
        name: name.into(),
        reason: reason.into(),
    }
}

/// A value for an error message: arrays by length, not contents.
fn short(value: &Value) -> String {
    match value {
        Value::Array(items) => format!("an array of {}", items.len()),
        other => format!("{other:?}"),
    }
}

/// A bounds-checked little-endian cursor.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    path: &'a Path,
}

/// Arrays nest at most this deep (real files use one level).
const MAX_NESTING: usize = 4;

impl<'a> Reader<'a> {
    fn format(&self, reason: impl Into<String>) -> GgufError {
        GgufError::Format {
            path: self.path.to_path_buf(),
            reason: reason.into(),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| {
                self.format(format!(
                    "truncated: `{what}` needs {n} bytes at offset {}, the file has {}",
                    self.at,
                    self.bytes.len()
                ))
            })?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Tensor `i`'s directory entry.
    fn directory_entry(&mut self, i: u64) -> Result<DirectoryEntry, GgufError> {
        let path = self.path;
        let name = self.string(&format!("tensor name #{i}"))?;
        let n_dims = self.u32(&name)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(tensor_error(
                path,
                &name,
                format!("{n_dims} dimensions (1 to {MAX_DIMS} allowed)"),
            ));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let d = self.u64(&name)?;
            dims.push(usize::try_from(d).map_err(|_| tensor_error(path, &name, format!("dimension {d} too large")))?);
        }
        let kind_id = self.u32(&name)?;
        let kind = GgmlType::from_id(kind_id).ok_or_else(|| {
            tensor_error(
                path,
                &name,
                format!(
                    "ggml type {kind_id} ({}) is not supported; supported: {}",
                    GgmlType::name_of(kind_id),
                    GgmlType::supported()
                ),
            )
        })?;
        let offset = self.u64(&name)?;
        Ok(DirectoryEntry {
            name,
            dims,
            kind,
            offset,
        })
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let len = usize::try_from(len).map_err(|_| self.format(format!("`{what}`: string length {len}")))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.format(format!("`{what}`: a string is not UTF-8")))
    }

    /// A value of GGUF type `kind`; `key` names it in errors.
    fn value(&mut self, kind: u32, key: &str, depth: usize) -> Result<Value, GgufError> {
        Ok(match kind {
            0 => Value::Unsigned(u64::from(self.array::<1>(key)?[0])),
            1 => Value::Signed(i64::from(i8::from_le_bytes(self.array(key)?))),
            2 => Value::Unsigned(u64::from(u16::from_le_bytes(self.array(key)?))),
            3 => Value::Signed(i64::from(i16::from_le_bytes(self.array(key)?))),
            4 => Value::Unsigned(u64::from(self.u32(key)?)),
            5 => Value::Signed(i64::from(i32::from_le_bytes(self.array(key)?))),
            6 => Value::Float(f64::from(f32::from_le_bytes(self.array(key)?))),
            7 => match self.array::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.format(format!("`{key}`: bool byte {b}"))),
            },
            8 => Value::String(self.string(key)?),
            9 => {
                if depth >= MAX_NESTING {
                    return Err(self.format(format!("`{key}`: arrays nested deeper than {MAX_NESTING}")));
                }
                let element = self.u32(key)?;
                let count = self.u64(key)?;
                // Every element takes at least one byte: a count beyond the bytes left is a lie.
                let left = (self.bytes.len() - self.at) as u64;
                if count > left {
                    return Err(self.format(format!(
                        "`{key}`: an array of {count} elements but only {left} bytes remain"
                    )));
                }
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(element, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::Unsigned(self.u64(key)?),
            11 => Value::Signed(i64::from_le_bytes(self.array(key)?)),
            12 => Value::Float(f64::from_le_bytes(self.array(key)?)),
            other => return Err(self.format(format!("`{key}`: unknown value type {other}"))),
        })
    }
}

//! TensorBoard event files, written natively: `tb/events.out.tfevents.<unix time>.<host>` in a
//! run directory, holding the same scalars as `metrics.jsonl` and the run's texts.
//!
//! The format is small and fixed, so it is written here rather than through a protobuf
//! toolchain: a file is a sequence of TFRecords,
//!
//! ```text
//! u64 length (little-endian) · u32 masked_crc32c(length) · data · u32 masked_crc32c(data)
//! masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8        (CRC-32C, Castagnoli)
//! ```
//!
//! each `data` a `tensorflow.Event` protobuf (tensorflow/core/util/event.proto): `wall_time` (1,
//! double), `step` (2, int64), then one of `file_version` (3, the first record:
//! `"brain.Event:2"`), `summary` (5: `Summary.value` (1) = `{tag (1), simple_value (2, float)}`
//! for a scalar, or `{tag, metadata (9) = {plugin_data (1) = {plugin_name (1) = "text"}},
//! tensor (8) = {dtype (1) = DT_STRING (7), tensor_shape (2) = {}, string_val (8)}}` for a text)
//! or `session_log` (7: `{status (1) = START (1)}`). A resumed run appends a new file that opens
//! with a `SessionLog` START at the first step it will write again: TensorBoard then drops the
//! older file's events from that step on, so no step is shown twice.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Writes one event file; every event is flushed at once, so a crash loses nothing written.
pub struct EventWriter {
    out: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// A new event file in `dir` (created if needed), opening with the file-version event.
    pub fn create(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let seconds = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let host = hostname();
        // Two writers in the same second (a run resumed at once) get distinct names.
        let mut path = dir.join(format!("events.out.tfevents.{seconds}.{host}"));
        let mut n = 1;
        while path.exists() {
            n += 1;
            path = dir.join(format!("events.out.tfevents.{seconds}.{host}.{n}"));
        }
        let mut writer = Self {
            out: BufWriter::new(File::create(&path)?),
            path,
        };
        writer.event(0, &field_bytes(3, b"brain.Event:2"))?;
        Ok(writer)
    }

    /// The file written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Scalars at `step`, one per `(tag, value)`, in one event.
    pub fn scalars<'a>(&mut self, step: u64, values: impl IntoIterator<Item = (&'a str, f32)>) -> std::io::Result<()> {
        let mut summary = Vec::new();
        for (tag, value) in values {
            let mut entry = field_bytes(1, tag.as_bytes());
            entry.push(key(2, FIXED32));
            entry.extend_from_slice(&value.to_le_bytes());
            summary.extend(field_bytes(1, &entry));
        }
        if summary.is_empty() {
            return Ok(());
        }
        self.event(step, &field_bytes(5, &summary))
    }

    /// A text (markdown) at `step` under `tag`, for TensorBoard's text plugin.
    pub fn text(&mut self, step: u64, tag: &str, text: &str) -> std::io::Result<()> {
        let plugin = field_bytes(1, &field_bytes(1, b"text"));
        let mut tensor = vec![key(1, VARINT), DT_STRING];
        tensor.extend(field_bytes(2, &[]));
        tensor.extend(field_bytes(8, text.as_bytes()));
        let mut value = field_bytes(1, tag.as_bytes());
        value.extend(field_bytes(9, &plugin));
        value.extend(field_bytes(8, &tensor));
        self.event(step, &field_bytes(5, &field_bytes(1, &value)))
    }

    /// A `SessionLog` START at `step`: TensorBoard drops earlier files' events from `step` on.
    pub fn session_start(&mut self, step: u64) -> std::io::Result<()> {
        self.event(step, &field_bytes(7, &[key(1, VARINT), 1]))
    }

    /// One event at `step` with `what` (its encoded oneof field), as one flushed record.
    fn event(&mut self, step: u64, what: &[u8]) -> std::io::Result<()> {
        let wall_time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut event = vec![key(1, FIXED64)];
        event.extend_from_slice(&wall_time.to_le_bytes());
        event.push(key(2, VARINT));
        varint(step, &mut event);
        event.extend_from_slice(what);
        let length = (event.len() as u64).to_le_bytes();
        self.out.write_all(&length)?;
        self.out.write_all(&masked_crc32c(&length).to_le_bytes())?;
        self.out.write_all(&event)?;
        self.out.write_all(&masked_crc32c(&event).to_le_bytes())?;
        self.out.flush()
    }
}

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LENGTH_DELIMITED: u8 = 2;
const FIXED32: u8 = 5;
/// `tensorflow.DataType.DT_STRING`.
const DT_STRING: u8 = 7;

/// A field's key byte (field numbers below 16).
fn key(field: u8, wire_type: u8) -> u8 {
    (field << 3) | wire_type
}

fn varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A length-delimited field: a string, bytes or an embedded message.
fn field_bytes(field: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![key(field, LENGTH_DELIMITED)];
    varint(bytes.len() as u64, &mut out);
    out.extend_from_slice(bytes);
    out
}

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), bit by bit through a table.
fn crc32c(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut crc = i as u32;
            let mut bit = 0;
            while bit < 8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0x82F6_3B78
                } else {
                    crc >> 1
                };
                bit += 1;
            }
            table[i] = crc;
            i += 1;
        }
        table
    };
    !bytes.iter().fold(!0u32, |crc, &b| {
        TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8)
    })
}

fn masked_crc32c(bytes: &[u8]) -> u32 {
    let crc = crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xA282_EAD8)
}

/// This machine's name, as TensorBoard's own writers put it in the file name.
fn hostname() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
        .collect();
    if name.is_empty() { "localhost".into() } else { name }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_its_check_value() {
        // The CRC catalogue's check value for CRC-32/ISCSI.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn varints_and_fields_encode_as_protobuf_does() {
        let mut out = Vec::new();
        varint(300, &mut out);
        assert_eq!(out, [0xAC, 0x02]);
        assert_eq!(field_bytes(1, b"ab"), [0x0A, 2, b'a', b'b']);
    }

    /// Every record's framing holds: the lengths and both masked checksums.
    #[test]
    fn records_are_framed_with_their_checksums() {
        let dir = std::env::temp_dir().join(format!("rein-tb-{}", std::process::id()));
        let mut writer = EventWriter::create(&dir).unwrap();
        writer.scalars(3, [("train/reward", 0.5), ("train/kl", 0.25)]).unwrap();
        writer.text(0, "recipe", "seed = 1").unwrap();
        writer.session_start(2).unwrap();
        let bytes = std::fs::read(writer.path()).unwrap();
        let mut at = 0;
        let mut records = 0;
        while at < bytes.len() {
            let length: [u8; 8] = bytes[at..at + 8].try_into().unwrap();
            let crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(&length));
            let n = u64::from_le_bytes(length) as usize;
            let data = &bytes[at + 12..at + 12 + n];
            let crc = u32::from_le_bytes(bytes[at + 12 + n..at + 16 + n].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(data));
            at += 16 + n;
            records += 1;
        }
        assert_eq!(records, 4);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

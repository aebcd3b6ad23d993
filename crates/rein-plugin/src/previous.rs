//! Components built against `rein:plugin@0.3.0`, the interface before step scores.
//!
//! 0.4.0 changed only `reward-api` (step scores in `completion-score`, token details in `group`,
//! the `inputs` function). Every other interface is the same in both versions, so the top-level
//! imports and exports a 0.3.0 component names with them are renamed to 0.4.0 before it is
//! compiled, and the host's 0.4.0 bindings run it. Nothing else in the binary changes, and
//! wasmtime still checks each function's type against 0.4.0's when it links, so a type that did
//! differ would fail to load rather than misbehave. A 0.3.0 reward keeps its
//! `reward-api@0.3.0` export and runs through bindings of the frozen 0.3.0 WIT
//! (`wit-0.3.0/plugin.wit`, [`crate::bindings::reward_v0_3`]).

use wasmparser::{Parser, Payload};

use crate::INTERFACE_VERSION;

/// The interface version the host still runs.
pub(crate) const PREVIOUS_VERSION: &str = "0.3.0";

/// The one 0.3.0 interface whose types 0.4.0 changed: its export keeps its name.
const CHANGED: &str = "rein:plugin/reward-api@0.3.0";

/// `name` under 0.4.0 when it is one of 0.3.0's unchanged interfaces.
fn renamed(name: &str) -> Option<String> {
    let interface = name
        .strip_prefix("rein:plugin/")?
        .strip_suffix(&format!("@{PREVIOUS_VERSION}"))?;
    (name != CHANGED).then(|| format!("rein:plugin/{interface}@{INTERFACE_VERSION}"))
}

/// `wasm` with the names of 0.3.0's unchanged interfaces moved to 0.4.0 (see the module docs),
/// or `None` when it names none (a 0.4.0 component, a core module, or a component of another
/// version, which loading then refuses with its usual error). An unparsable binary is `None`
/// too: compiling it reports the error.
pub(crate) fn adopt(wasm: &[u8]) -> Option<Vec<u8>> {
    if !Parser::is_component(wasm) {
        return None;
    }
    let mut out = wasm[..8].to_vec();
    let (mut depth, mut changed) = (0usize, false);
    for payload in Parser::new(0).parse_all(wasm) {
        let payload = payload.ok()?;
        let top = depth == 0;
        match &payload {
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            _ => {}
        }
        let Some((id, range)) = payload.as_section().filter(|_| top) else {
            continue;
        };
        let entries: Option<Result<Vec<(usize, &str)>, _>> = match &payload {
            Payload::ComponentImportSection(reader) => Some(
                (reader.clone().into_iter_with_offsets())
                    .map(|entry| entry.map(|(at, import)| (at, import.name.name)))
                    .collect(),
            ),
            Payload::ComponentExportSection(reader) => Some(
                (reader.clone().into_iter_with_offsets())
                    .map(|entry| entry.map(|(at, export)| (at, export.name.name)))
                    .collect(),
            ),
            _ => None,
        };
        let data = match entries {
            Some(entries) => {
                let entries = entries.ok()?;
                let section = rename_entries(wasm, range.clone(), &entries);
                changed |= section.is_some();
                section.unwrap_or_else(|| wasm[range].to_vec())
            }
            None => wasm[range].to_vec(),
        };
        out.push(id);
        write_leb(&mut out, data.len());
        out.extend_from_slice(&data);
    }
    changed.then_some(out)
}

/// The body of an import or export section (`range` of `wasm`) with its entries' names moved
/// to 0.4.0, or `None` when no name changes. Each entry (`entries`: its offset and name) is a
/// leading byte, the name as a length-prefixed string, then its type or index, copied as is.
fn rename_entries(wasm: &[u8], range: std::ops::Range<usize>, entries: &[(usize, &str)]) -> Option<Vec<u8>> {
    if entries.iter().all(|(_, name)| renamed(name).is_none()) {
        return None;
    }
    let first = entries.first().map_or(range.end, |(at, _)| *at);
    let mut out = wasm[range.start..first].to_vec();
    for (i, (at, name)) in entries.iter().enumerate() {
        let end = entries.get(i + 1).map_or(range.end, |(next, _)| *next);
        let name_at = at + 1 + leb_len(name.len());
        let rest = &wasm[name_at + name.len()..end];
        let name = renamed(name).unwrap_or_else(|| name.to_string());
        out.push(wasm[*at]);
        write_leb(&mut out, name.len());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(rest);
    }
    Some(out)
}

/// Appends `value` as unsigned LEB128.
fn write_leb(out: &mut Vec<u8>, mut value: usize) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// How many bytes `value` takes as unsigned LEB128.
fn leb_len(value: usize) -> usize {
    let mut out = Vec::new();
    write_leb(&mut out, value);
    out.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_unchanged_interfaces_of_0_3_0_are_renamed() {
        assert_eq!(
            renamed("rein:plugin/types@0.3.0").as_deref(),
            Some("rein:plugin/types@0.4.0")
        );
        assert_eq!(
            renamed("rein:plugin/tool-api@0.3.0").as_deref(),
            Some("rein:plugin/tool-api@0.4.0")
        );
        assert_eq!(renamed(CHANGED), None);
        assert_eq!(renamed("rein:plugin/types@0.2.0"), None);
        assert_eq!(renamed("wasi:cli/run@0.3.0"), None);
    }

    #[test]
    fn leb128_lengths_match_their_encoding() {
        for value in [0, 1, 127, 128, 300, 16_383, 16_384, 1 << 21] {
            let mut out = Vec::new();
            write_leb(&mut out, value);
            assert_eq!(out.len(), leb_len(value), "{value}");
            let decoded = out
                .iter()
                .rev()
                .fold(0usize, |acc, b| (acc << 7) | usize::from(b & 0x7f));
            assert_eq!(decoded, value);
        }
    }
}

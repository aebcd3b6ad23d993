//! Components built against earlier versions of `rein:plugin`: 0.4.0 (before images) and 0.3.0
//! (before step scores).
//!
//! Each version changed some interfaces and left the others as they were:
//! - 0.4.0 changed `reward-api` (step scores in `completion-score`, token details in `group`,
//!   the `inputs` function);
//! - 0.5.0 changed `reward-api` (the prompt's images), `tool-api` (outputs with images) and
//!   `text-env-api` (images in episodes); `types` only gained `image`, which no older component
//!   uses.
//!
//! Before an older component is compiled, each interface it imports or exports is renamed to the
//! newest version that defines it the same way ([`runs_as`]), and the host's bindings of that
//! version run it: the current ones for `types`, `environment-api` and `judge`, the frozen 0.4.0
//! WIT's (`wit-0.4.0/plugin.wit`) for the tool and text-env interfaces of 0.3.0 and 0.4.0, and
//! each version's own for its reward (`wit-0.3.0/`). Nothing else in the binary changes, and
//! wasmtime still checks each function's type when it links, so a type that did differ would
//! fail to load rather than misbehave.

use wasmparser::{Parser, Payload};

use crate::INTERFACE_VERSION;

/// The earlier interface versions the host still runs, newest first.
pub(crate) const PREVIOUS_VERSIONS: [&str; 2] = ["0.4.0", "0.3.0"];

/// The version whose bindings run `interface` of a component built against `version`, when it
/// is not `version` itself: the newest that defines it the same way.
fn runs_as(interface: &str, version: &str) -> Option<&'static str> {
    match (interface, version) {
        ("types" | "environment-api" | "judge", "0.3.0" | "0.4.0") => Some(INTERFACE_VERSION),
        ("tool-api" | "text-env-api", "0.3.0") => Some("0.4.0"),
        _ => None,
    }
}

/// `name` (`rein:plugin/<interface>@<version>`) under the version that runs it ([`runs_as`]).
fn renamed(name: &str) -> Option<String> {
    let (interface, version) = name.strip_prefix("rein:plugin/")?.split_once('@')?;
    runs_as(interface, version).map(|to| format!("rein:plugin/{interface}@{to}"))
}

/// The earlier version a rein interface `name` belongs to, if any.
fn previous_version(name: &str) -> Option<&'static str> {
    let (_, version) = name.strip_prefix("rein:plugin/")?.split_once('@')?;
    PREVIOUS_VERSIONS.into_iter().find(|v| *v == version)
}

/// `wasm` with its interfaces renamed to the versions that run them (see the module docs), and
/// the earlier version it was built against; `None` when it names no earlier version's
/// interface to rename (a current component, a core module, or a component of another
/// version, which loading then refuses with its usual error). An unparsable binary is `None`
/// too: compiling it reports the error.
pub(crate) fn adopt(wasm: &[u8]) -> Option<(Vec<u8>, &'static str)> {
    if !Parser::is_component(wasm) {
        return None;
    }
    let mut out = wasm[..8].to_vec();
    let (mut depth, mut changed, mut built_against) = (0usize, false, None);
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
                built_against = built_against.or_else(|| entries.iter().find_map(|(_, name)| previous_version(name)));
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
    Some((out, built_against?)).filter(|_| changed)
}

/// The body of an import or export section (`range` of `wasm`) with its entries' names moved
/// to the versions that run them, or `None` when no name changes. Each entry (`entries`: its
/// offset and name) is a leading byte, the name as a length-prefixed string, then its type or
/// index, copied as is.
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
    fn each_interface_runs_as_the_newest_version_defining_it_the_same() {
        let current = |interface: &str| Some(format!("rein:plugin/{interface}@{INTERFACE_VERSION}"));
        for version in PREVIOUS_VERSIONS {
            for interface in ["types", "environment-api", "judge"] {
                assert_eq!(
                    renamed(&format!("rein:plugin/{interface}@{version}")),
                    current(interface)
                );
            }
            assert_eq!(renamed(&format!("rein:plugin/reward-api@{version}")), None);
        }
        assert_eq!(
            renamed("rein:plugin/tool-api@0.3.0").as_deref(),
            Some("rein:plugin/tool-api@0.4.0")
        );
        assert_eq!(renamed("rein:plugin/text-env-api@0.4.0"), None);
        assert_eq!(renamed("rein:plugin/types@0.2.0"), None);
        assert_eq!(renamed("wasi:cli/run@0.3.0"), None);
        assert_eq!(previous_version("rein:plugin/tool-api@0.4.0"), Some("0.4.0"));
        assert_eq!(
            previous_version(&format!("rein:plugin/types@{INTERFACE_VERSION}")),
            None
        );
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

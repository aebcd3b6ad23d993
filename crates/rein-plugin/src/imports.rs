//! What the sandbox gives a component for each interface it imports.

use serde::Serialize;

/// How the sandbox answers one imported interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Linked, behaving as [`Import::what`] says.
    Provided,
    /// Linked so the component loads, but every call that would reach outside fails.
    Refused,
    /// Linked for the plugins a recipe grants it to (a judge model); others are refused.
    Granted,
    /// Not linked: a component importing it cannot load.
    Missing,
}

/// One interface a component imports, and what it gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Import {
    /// The interface, e.g. `wasi:clocks/wall-clock@0.2.3`.
    pub name: String,
    /// Whether it is provided.
    pub access: Access,
    /// What the plugin observes through it.
    pub what: &'static str,
}

impl Import {
    /// The sandbox's answer to the interface `name`.
    pub fn of(name: &str) -> Import {
        let interface = name.split_once('@').map_or(name, |(interface, _)| interface);
        let (access, what) = policy(interface);
        Import {
            name: name.to_string(),
            access,
            what,
        }
    }
}

fn policy(interface: &str) -> (Access, &'static str) {
    use Access::*;
    match interface {
        "wasi:clocks/monotonic-clock" => (
            Provided,
            "virtual: from 0, +1 µs per read, jumps to a deadline when waited on (real with `real_clock`)",
        ),
        "wasi:clocks/wall-clock" => (
            Provided,
            "virtual: the Unix epoch plus the monotonic count (real with `real_clock`)",
        ),
        "wasi:io/poll" => (Provided, "every wait ends by the call's deadline (`timeout_ms`)"),
        "wasi:io/streams" | "wasi:io/error" => (Provided, "stdin is empty; stdout and stderr are captured"),
        "wasi:random/random" | "wasi:random/insecure" | "wasi:random/insecure-seed" => {
            (Provided, "fixed bytes, the same on every run")
        }
        "wasi:cli/environment" => (Provided, "no variables, no arguments"),
        "wasi:cli/exit" => (Provided, "ends the call as a trap"),
        "wasi:cli/stdin" => (Provided, "empty"),
        "wasi:cli/stdout" | "wasi:cli/stderr" => (Provided, "captured; the last `stdio_kib` kept"),
        "wasi:cli/terminal-input"
        | "wasi:cli/terminal-output"
        | "wasi:cli/terminal-stdin"
        | "wasi:cli/terminal-stdout"
        | "wasi:cli/terminal-stderr" => (Provided, "not a terminal"),
        "wasi:filesystem/preopens" => (Provided, "no directories"),
        "wasi:filesystem/types" => (Refused, "no file can be opened"),
        _ if interface.starts_with("wasi:sockets/") => (Refused, "every socket and name lookup is refused"),
        crate::judge::JUDGE_IMPORT => (
            Granted,
            "the judge model the recipe grants (`judge = {…}`), within its budget; refused without the grant",
        ),
        _ if interface.starts_with("rein:plugin/") => (Provided, "the plugin interface"),
        _ => (Missing, "not provided: a plugin importing it cannot load"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_ignored_and_unknown_interfaces_are_missing() {
        assert_eq!(Import::of("wasi:clocks/wall-clock@0.2.3").access, Access::Provided);
        assert_eq!(Import::of("wasi:sockets/tcp@0.2.0").access, Access::Refused);
        assert_eq!(Import::of("wasi:http/outgoing-handler@0.2.0").access, Access::Missing);
        assert_eq!(Import::of("test:spy/exfiltrate").access, Access::Missing);
        assert_eq!(Import::of("rein:plugin/types@0.3.0").access, Access::Provided);
        assert_eq!(Import::of("rein:plugin/judge@0.3.0").access, Access::Granted);
    }
}

//! Architecture checks that run as tests (`cargo test -p xtask`, so `cargo xtask test` runs
//! them): crate dependencies point one way, only the crates docs/architecture.md names link
//! wasmtime or burn, plugins build against rein-pdk alone, rein-core does no I/O, no crate has
//! an import cycle between its modules, and no source file or function under `crates/` is
//! longer than a reader takes in (800 and 100 lines, with an allow-list that gives each
//! exception its reason). docs/architecture.md states each rule.

#![cfg(test)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::workspace::root;

/// The crates each rein crate may depend on (its `[dependencies]` among rein's own crates).
const ALLOWED: &[(&str, &[&str])] = &[
    ("rein-core", &[]),
    ("rein-pdk", &[]),
    ("rein-kernels", &[]),
    ("rein-gguf", &["rein-kernels"]),
    ("rein-recipe", &["rein-core"]),
    ("rein-plugin", &["rein-core"]),
    ("rein-model", &["rein-core", "rein-kernels", "rein-gguf"]),
    ("rein-optim", &["rein-core"]),
    ("rein-sampler", &["rein-core", "rein-kernels", "rein-model"]),
    ("rein-plot", &[]),
    ("rein-py", &["rein-core", "rein-plugin"]),
    ("rein-run", &["rein-core"]),
    (
        "rein-control",
        &[
            "rein-core",
            "rein-kernels",
            "rein-recipe",
            "rein-model",
            "rein-optim",
            "rein-sampler",
            "rein-run",
        ],
    ),
    (
        "rein-posttrain",
        &[
            "rein-core",
            "rein-recipe",
            "rein-plugin",
            "rein-model",
            "rein-optim",
            "rein-sampler",
            "rein-run",
        ],
    ),
    (
        "rein-train",
        &[
            "rein-core",
            "rein-recipe",
            "rein-plugin",
            "rein-model",
            "rein-run",
            "rein-control",
            "rein-posttrain",
        ],
    ),
    (
        "rein-cli",
        &[
            "rein-core",
            "rein-kernels",
            "rein-gguf",
            "rein-recipe",
            "rein-plugin",
            "rein-model",
            "rein-sampler",
            "rein-run",
            "rein-control",
            "rein-posttrain",
            "rein-train",
            "rein-plot",
        ],
    ),
    (
        "rein-gpu-check",
        &[
            "rein-core",
            "rein-model",
            "rein-optim",
            "rein-recipe",
            "rein-sampler",
            "rein-run",
            "rein-posttrain",
        ],
    ),
];

#[test]
fn crate_dependencies_point_one_way() {
    let crates = root().join("crates");
    for entry in std::fs::read_dir(&crates).unwrap() {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let allowed = ALLOWED
            .iter()
            .find(|(crate_name, _)| *crate_name == name)
            .unwrap_or_else(|| panic!("{name} is not in tidy.rs's ALLOWED table: add it with its allowed dependencies"))
            .1;
        let manifest: toml::Table = std::fs::read_to_string(dir.join("Cargo.toml"))
            .unwrap()
            .parse()
            .unwrap();
        let deps = manifest.get("dependencies").and_then(|d| d.as_table());
        for dep in deps.into_iter().flat_map(|d| d.keys()) {
            if dep.starts_with("rein-") {
                assert!(
                    allowed.contains(&dep.as_str()),
                    "{name} depends on {dep}, which docs/architecture.md does not allow"
                );
            }
        }
    }
}

/// The `[dependencies]` (and `[dev-dependencies]`, when `dev`) names of a manifest.
fn dependency_names(manifest: &Path, dev: bool) -> Vec<String> {
    let manifest: toml::Table = std::fs::read_to_string(manifest)
        .unwrap_or_else(|e| panic!("{}: {e}", manifest.display()))
        .parse()
        .unwrap();
    let sections: &[&str] = if dev {
        &["dependencies", "dev-dependencies"]
    } else {
        &["dependencies"]
    };
    (sections.iter())
        .filter_map(|s| manifest.get(*s).and_then(|d| d.as_table()))
        .flat_map(|d| d.keys().cloned())
        .collect()
}

/// Every manifest of the host workspace: `crates/*`, `xtask`, `benches` and `tests`.
fn host_manifests() -> Vec<(String, PathBuf)> {
    let mut manifests: Vec<(String, PathBuf)> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|dir| {
            (
                dir.file_name().unwrap().to_string_lossy().into_owned(),
                dir.join("Cargo.toml"),
            )
        })
        .collect();
    for extra in ["xtask", "benches", "tests"] {
        manifests.push((extra.to_string(), root().join(extra).join("Cargo.toml")));
    }
    manifests.sort();
    manifests
}

#[test]
fn only_rein_plugin_links_wasmtime_and_only_the_tensor_crates_link_burn() {
    // Crates that may name burn: the models, the losses, the samplers, the trainers, and the
    // benches, tests and GPU check that drive them.
    let burn = [
        "rein-model",
        "rein-optim",
        "rein-sampler",
        "rein-run",
        "rein-control",
        "rein-posttrain",
        "rein-train",
        "rein-gpu-check",
        "benches",
        "tests",
    ];
    for (name, manifest) in host_manifests() {
        for dep in dependency_names(&manifest, true) {
            if dep.starts_with("wasmtime") {
                assert!(
                    name == "rein-plugin",
                    "{name} depends on {dep}: only rein-plugin links wasmtime (docs/architecture.md)"
                );
            }
            if dep == "burn" || dep.starts_with("burn-") {
                assert!(
                    burn.contains(&name.as_str()),
                    "{name} depends on {dep}: only {} use burn (docs/architecture.md)",
                    burn.join(", ")
                );
            }
        }
    }
    // xtask drives the others through cargo and their binaries, never as libraries.
    let xtask = dependency_names(&root().join("xtask/Cargo.toml"), false);
    assert!(
        !xtask.iter().any(|d| d.starts_with("rein-")),
        "xtask depends on {xtask:?}"
    );
}

#[test]
fn plugins_build_against_rein_pdk_alone() {
    for workspace in ["plugins", "tests/plugins"] {
        for entry in std::fs::read_dir(root().join(workspace)).unwrap() {
            let manifest = entry.unwrap().path().join("Cargo.toml");
            if !manifest.is_file() {
                continue; // a Python or JavaScript plugin, or a file
            }
            for dep in dependency_names(&manifest, true) {
                assert!(
                    !dep.starts_with("wasmtime") && dep != "burn" && !dep.starts_with("burn-"),
                    "{}: a plugin depends on {dep}",
                    manifest.display()
                );
                assert!(
                    !dep.starts_with("rein-") || dep == "rein-pdk",
                    "{}: a plugin depends on {dep}; plugins build against rein-pdk alone",
                    manifest.display()
                );
            }
        }
    }
}

#[test]
fn rein_core_does_no_io() {
    for file in rust_files(&root().join("crates/rein-core/src")) {
        let text = std::fs::read_to_string(&file).unwrap();
        for io in ["std::fs", "std::io", "std::net", "std::process", "std::env"] {
            assert!(
                !text.contains(io),
                "{} uses {io}: rein-core holds plain data and traits, no I/O",
                file.display()
            );
        }
    }
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path().join("src"))
        .collect();
    dirs.push(root().join("xtask/src"));
    dirs.push(root().join("benches/src"));
    for src in dirs {
        let graph = module_graph(&src);
        if let Some(cycle) = find_cycle(&graph) {
            panic!("{}: modules import each other: {}", src.display(), cycle.join(" → "));
        }
    }
}

/// A crate's modules (`""` for the root, `lm::grpo` for `src/lm/grpo.rs`) and the modules each
/// one imports from. Re-exports (`pub use`) are structure, not dependencies, and are skipped; a
/// name imported through a re-export counts as imported from the module that defines it.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let files = rust_files(src);
    let modules: BTreeMap<String, String> = files
        .iter()
        .map(|file| (module_of(src, file), std::fs::read_to_string(file).unwrap()))
        .collect();
    // Names each module re-exports, and where they come from.
    let mut reexports: BTreeMap<(String, String), String> = BTreeMap::new();
    for (module, text) in &modules {
        for statement in use_statements(text).into_iter().filter(|s| s.public) {
            for path in statement.paths {
                let full = absolute(module, &path);
                if let Some((name, from)) = full.split_last() {
                    reexports.insert((module.clone(), name.clone()), from.join("::"));
                }
            }
        }
    }
    let resolve = |path: &[String]| -> Option<String> {
        // The longest prefix that is a module; a name it re-exports is followed to the module
        // that defines it.
        let depth = (0..=path.len())
            .rev()
            .find(|&n| modules.contains_key(&path[..n].join("::")))?;
        let mut module = path[..depth].join("::");
        if let Some(name) = path.get(depth) {
            let mut hops = 0;
            while let Some(from) = reexports.get(&(module.clone(), name.clone()))
                && modules.contains_key(from)
                && hops < 16
            {
                module = from.clone();
                hops += 1;
            }
        }
        Some(module)
    };
    let mut graph = BTreeMap::new();
    for (module, text) in &modules {
        let mut uses = BTreeSet::new();
        let code: String = text
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let mut paths: Vec<Vec<String>> = use_statements(&code)
            .into_iter()
            .filter(|s| !s.public)
            .flat_map(|s| s.paths)
            .map(|p| absolute(module, &p))
            .collect();
        // Paths in code: from the crate root, the parent, or a child module without `self::`
        // (`q8::QuadCodes` written in `packed`).
        let prefix = if module.is_empty() {
            String::new()
        } else {
            format!("{module}::")
        };
        let mut starts = vec!["crate::".to_string(), "super::".to_string()];
        starts.extend(
            (modules.keys())
                .filter_map(|m| m.strip_prefix(&prefix))
                .filter(|child| !child.is_empty() && !child.contains("::"))
                .map(|child| format!("{child}::")),
        );
        paths.extend(code_paths(&code, &starts).into_iter().map(|p| absolute(module, &p)));
        for path in paths {
            if let Some(target) = resolve(&path)
                && target != *module
                && !is_ancestor(&target, module)
            {
                uses.insert(target);
            }
        }
        graph.insert(module.clone(), uses);
    }
    graph
}

/// Whether `ancestor` contains `module` (a child may use its parent's items: the parent's
/// `mod` declaration is structure, not a dependency).
fn is_ancestor(ancestor: &str, module: &str) -> bool {
    ancestor.is_empty() || module.starts_with(&format!("{ancestor}::"))
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts.join("::")
}

/// `path` (starting with `crate` or `super`, or relative to `module`) as segments from the root.
fn absolute(module: &str, path: &[String]) -> Vec<String> {
    let mut here: Vec<String> = module.split("::").filter(|s| !s.is_empty()).map(String::from).collect();
    match path.first().map(String::as_str) {
        Some("crate") => path[1..].to_vec(),
        Some("super") => {
            let mut rest = path;
            while rest.first().map(String::as_str) == Some("super") {
                here.pop();
                rest = &rest[1..];
            }
            here.extend(rest.iter().cloned());
            here
        }
        Some("self") => {
            here.extend(path[1..].iter().cloned());
            here
        }
        _ => {
            here.extend(path.iter().cloned());
            here
        }
    }
}

struct UseStatement {
    public: bool,
    paths: Vec<Vec<String>>,
}

/// Every `use` statement, its tree flattened (paths into other crates resolve to no module of
/// this one and are ignored later).
fn use_statements(text: &str) -> Vec<UseStatement> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("use ") {
        let before = &rest[..at];
        let starts_statement = before.is_empty() || before.ends_with(char::is_whitespace);
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let prefix = before[line_start..].trim();
        let after = &rest[at + 4..];
        let Some(end) = after.find(';') else { break };
        let tree = after[..end].trim();
        rest = &after[end..];
        if !starts_statement || !(prefix.is_empty() || prefix.starts_with("pub")) {
            continue;
        }
        let mut paths = Vec::new();
        flatten(tree, &mut Vec::new(), &mut paths);
        out.push(UseStatement {
            public: prefix.starts_with("pub"),
            paths,
        });
    }
    out
}

/// Flattens a use tree (`a::{b, c::{d, e}}`) into paths; `self` inside braces means the prefix.
fn flatten(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let n = prefix.len();
        prefix.extend(head);
        for item in split_top_level(inner) {
            flatten(item, prefix, out);
        }
        prefix.truncate(n);
        return;
    }
    let item = tree.split(" as ").next().unwrap_or(tree).trim();
    if item.is_empty() {
        return;
    }
    let mut path = prefix.clone();
    for part in item.split("::").map(str::trim) {
        if part != "self" && part != "*" {
            path.push(part.to_string());
        }
    }
    out.push(path);
}

fn split_top_level(text: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0, 0, Vec::new());
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

/// Paths written in code outside `use` statements that start with one of `starts`
/// (`crate::`, `super::`, or a child module's `q8::`): `crate::a::B`, `super::c::d`.
fn code_paths(text: &str, starts: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for start in starts {
        let mut rest = text;
        while let Some(at) = rest.find(start.as_str()) {
            let before = rest[..at].chars().last();
            let path: String = rest[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            rest = &rest[at + start.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let line_start = text.len() - rest.len();
            let line = text[..line_start].rsplit('\n').next().unwrap_or_default();
            if line.trim_start().starts_with("use ") || line.trim_start().starts_with("pub use ") {
                continue;
            }
            out.push(path.trim_end_matches(':').split("::").map(String::from).collect());
        }
    }
    out
}

/// A cycle in `graph`, as the modules along it (the first repeated at the end).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, stack, done) {
                return Some(cycle);
            }
        }
        stack.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_checker_sees_a_cycle_through_a_reexport() {
    let dir = std::env::temp_dir().join(format!("rein-tidy-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\npub use a::Thing;\n").unwrap();
    std::fs::write(
        dir.join("a/mod.rs"),
        "mod inner;\npub use inner::Thing;\nuse crate::b::Other;\n",
    )
    .unwrap();
    std::fs::write(dir.join("a/inner.rs"), "pub struct Thing;\n").unwrap();
    std::fs::write(dir.join("b.rs"), "use crate::Thing;\npub struct Other;\n").unwrap();
    let graph = module_graph(&dir);
    assert_eq!(graph["b"], BTreeSet::from(["a::inner".to_string()]));
    assert_eq!(graph["a"], BTreeSet::from(["b".to_string()]));
    assert!(find_cycle(&graph).is_none(), "b uses a::inner, not a: no cycle");
    std::fs::write(dir.join("a/inner.rs"), "pub struct Thing(crate::b::Other);\n").unwrap();
    let cycle = find_cycle(&module_graph(&dir)).expect("a::inner → b → a::inner");
    assert!(
        cycle.contains(&"a::inner".to_string()) && cycle.contains(&"b".to_string()),
        "{cycle:?}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// The longest a source file under `crates/` may be, in lines (tests may live in their own file).
const MAX_FILE_LINES: usize = 800;

/// The longest a function under `crates/` may be, in lines (signature to closing brace).
const MAX_FUNCTION_LINES: usize = 100;

/// Files allowed to be longer than [`MAX_FILE_LINES`], each with its reason.
const LONG_FILES: &[(&str, &str)] = &[];

/// Functions allowed to be longer than [`MAX_FUNCTION_LINES`] (`file`, `function`, reason).
const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[];

fn crate_sources() -> Vec<PathBuf> {
    let mut files = rust_files(&root().join("crates"));
    files.sort();
    files
}

fn relative(file: &Path) -> String {
    file.strip_prefix(root()).unwrap().to_string_lossy().replace('\\', "/")
}

#[test]
fn no_source_file_is_longer_than_800_lines() {
    let mut long = Vec::new();
    for file in crate_sources() {
        let lines = std::fs::read_to_string(&file).unwrap().lines().count();
        let name = relative(&file);
        if lines > MAX_FILE_LINES && !LONG_FILES.iter().any(|(f, _)| *f == name) {
            long.push(format!("{name}: {lines} lines"));
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines (split them, or move tests to their own file):\n{}",
        long.join("\n")
    );
}

#[test]
fn no_function_is_longer_than_100_lines() {
    let mut long = Vec::new();
    for file in crate_sources() {
        let name = relative(&file);
        for (function, lines) in function_lengths(&std::fs::read_to_string(&file).unwrap()) {
            let allowed = LONG_FUNCTIONS.iter().any(|(f, n, _)| *f == name && *n == function);
            if lines > MAX_FUNCTION_LINES && !allowed {
                long.push(format!("{name}: fn {function}: {lines} lines"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n{}",
        long.join("\n")
    );
}

/// Each function in `text` (nested ones too) with its length in lines, from the line of `fn`
/// to the line of its closing brace. Braces in strings, characters and comments do not count.
fn function_lengths(text: &str) -> Vec<(String, usize)> {
    let code = without_literals(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else { continue };
        let mut depth = 0i64;
        let mut opened = false;
        for (offset, line) in lines[start..].iter().enumerate() {
            for c in line.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if !opened && line.trim_end().ends_with(';') {
                break;
            }
            if opened && depth <= 0 {
                out.push((name.clone(), offset + 1));
                break;
            }
        }
    }
    out
}

/// The name of the function a line declares (`pub(crate) async fn name<…>(`), if any.
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line.trim_start();
    if let Some(after) = rest.strip_prefix("pub") {
        rest = match after.strip_prefix('(') {
            Some(scoped) => scoped.split_once(')')?.1.trim_start(),
            None => after.trim_start(),
        };
    }
    for qualifier in ["const ", "async ", "unsafe ", "extern \"C\" "] {
        rest = rest.strip_prefix(qualifier).unwrap_or(rest);
    }
    let name: String = rest
        .strip_prefix("fn ")?
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// `text` with the contents of comments, strings (raw ones too) and character literals blanked
/// out, lines kept.
fn without_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let keep_lines = |out: &mut String, from: &[char]| out.extend(from.iter().filter(|&&c| c == '\n'));
    while i < chars.len() {
        let rest = &chars[i..];
        let starts = |s: &str| s.chars().enumerate().all(|(k, c)| rest.get(k) == Some(&c));
        let end = if starts("//") {
            rest.iter().position(|&c| c == '\n').unwrap_or(rest.len())
        } else if starts("/*") {
            (2..rest.len())
                .find(|&k| rest[k - 1] == '*' && rest[k] == '/')
                .map_or(rest.len(), |k| k + 1)
        } else if rest[0] == 'r'
            && (starts("r\"") || starts("r#"))
            && !chars
                .get(i.wrapping_sub(1))
                .is_some_and(|c| c.is_alphanumeric() || *c == '_')
        {
            let hashes = rest[1..].iter().take_while(|&&c| c == '#').count();
            if rest.get(1 + hashes) != Some(&'"') {
                out.push(rest[0]);
                i += 1;
                continue;
            }
            let close: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            (2 + hashes..rest.len())
                .find(|&k| rest[k..].starts_with(&close))
                .map_or(rest.len(), |k| k + close.len())
        } else if rest[0] == '"' {
            let mut k = 1;
            while k < rest.len() && rest[k] != '"' {
                k += if rest[k] == '\\' { 2 } else { 1 };
            }
            k + 1
        } else if rest[0] == '\'' && rest.get(1) == Some(&'\\') {
            // An escaped character: '\'', '\\', '\n', '\u{…}'.
            (3..rest.len()).find(|&k| rest[k] == '\'').map_or(rest.len(), |k| k + 1)
        } else if rest[0] == '\'' && rest.get(2) == Some(&'\'') {
            3
        } else {
            out.push(rest[0]);
            i += 1;
            continue;
        };
        let end = end.min(rest.len());
        keep_lines(&mut out, &rest[..end]);
        i += end;
    }
    out
}

#[test]
fn function_lengths_skip_braces_in_literals_and_count_nested_functions() {
    let text = "fn a() {\n    let s = \"}}\";\n    let c = '}';\n    let e = '\\'';\n    // }\n    fn b() {\n    }\n}\nfn c();\n";
    assert_eq!(function_lengths(text), [("a".to_string(), 8), ("b".to_string(), 2)]);
    let raw = "pub(crate) fn r() {\n    let s = r#\"{\"a\": \"}\"}\"#;\n}\n";
    assert_eq!(function_lengths(raw), [("r".to_string(), 3)]);
}

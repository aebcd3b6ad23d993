//! Recipe composition: `extends` files deep-merged in order, then the recipe itself, then
//! `--set key.path=value` overrides. Every leaf remembers which file set it, so errors found
//! later can name the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

use super::error::RecipeError;

/// Where `--set` overrides come from, for error messages.
pub(crate) const OVERRIDE_SOURCE: &str = "--set";

/// A merged recipe table with the origin of each key path.
#[derive(Debug, Clone, Default)]
pub(crate) struct Composed {
    pub(crate) table: Table,
    origins: BTreeMap<String, PathBuf>,
}

impl Composed {
    /// The file that set `path` (or its nearest parent).
    pub(crate) fn origin(&self, path: &str) -> PathBuf {
        let mut key = path.to_string();
        loop {
            if let Some(file) = self.origins.get(&key) {
                return file.clone();
            }
            match key.rfind(['.', '[']) {
                Some(i) => key.truncate(i),
                None => return self.origins.get("").cloned().unwrap_or_default(),
            }
        }
    }

    /// Loads `path` with everything it extends.
    pub(crate) fn load(path: &Path) -> Result<Self, RecipeError> {
        let mut composed = Composed::default();
        load_into(&mut composed, path, None, &mut Vec::new())?;
        composed.origins.insert(String::new(), path.to_path_buf());
        Ok(composed)
    }

    /// Applies one `key.path=value` override. The value is TOML (`0.3`, `true`, `[64, 64]`,
    /// `"text"`); anything that does not parse as TOML is taken as a string.
    pub(crate) fn apply_override(&mut self, arg: &str) -> Result<(), RecipeError> {
        let fail = |message: &str| RecipeError::Override {
            arg: arg.into(),
            message: message.into(),
        };
        let (key, raw) = arg.split_once('=').ok_or_else(|| fail("expected key.path=value"))?;
        let key = key.trim();
        if key.is_empty() || key.split('.').any(|part| part.trim().is_empty()) {
            return Err(fail("the key path is empty or has an empty part"));
        }
        let value = match format!("v = {}", raw.trim()).parse::<Table>() {
            Ok(mut t) => t.remove("v").unwrap_or(Value::String(raw.into())),
            Err(_) => Value::String(raw.trim().to_string()),
        };
        let parts: Vec<&str> = key.split('.').map(str::trim).collect();
        let mut table = &mut self.table;
        let mut i = 0;
        while i + 1 < parts.len() {
            let entry = table
                .entry(parts[i].to_string())
                .or_insert_with(|| Value::Table(Table::new()));
            table = match entry {
                Value::Table(t) => t,
                // `reward.1.weight`: an array of tables is indexed from 0.
                Value::Array(items) if i + 2 < parts.len() => {
                    let len = items.len();
                    let index = parts[i + 1].parse::<usize>().ok().filter(|&n| n < len);
                    i += 1;
                    match index.map(|n| &mut items[n]) {
                        Some(Value::Table(t)) => t,
                        _ => {
                            let list = parts[..i].join(".");
                            return Err(fail(&format!(
                                "`{list}` is a list of {len} tables: index it from 0, as `{list}.0`"
                            )));
                        }
                    }
                }
                _ => return Err(fail(&format!("`{}` is not a table", parts[..=i].join(".")))),
            };
            i += 1;
        }
        let last = parts[parts.len() - 1].to_string();
        match (table.get_mut(&last), value) {
            (Some(Value::Table(existing)), Value::Table(new)) => {
                merge(existing, new, key, Path::new(OVERRIDE_SOURCE), &mut self.origins)
            }
            (_, value) => {
                record(&value, key, Path::new(OVERRIDE_SOURCE), &mut self.origins);
                table.insert(last, value);
            }
        }
        Ok(())
    }
}

fn load_into(
    composed: &mut Composed,
    path: &Path,
    from: Option<&Path>,
    stack: &mut Vec<PathBuf>,
) -> Result<(), RecipeError> {
    let key = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    if let Some(start) = stack.iter().position(|p| *p == key) {
        let mut chain = stack[start..].to_vec();
        chain.push(key);
        return Err(RecipeError::Cycle { chain });
    }
    let text = std::fs::read_to_string(path).map_err(|e| RecipeError::Missing {
        file: path.to_path_buf(),
        from: from.map(Path::to_path_buf),
        reason: e.to_string(),
    })?;
    let mut table: Table = text.parse().map_err(|e: toml::de::Error| {
        let (line, column) = e.span().map(|s| line_column(&text, s.start)).unwrap_or((1, 1));
        RecipeError::Syntax {
            file: path.to_path_buf(),
            line,
            column,
            message: e.message().trim().to_string(),
        }
    })?;
    let extends = match table.remove("extends") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|item| match item {
                Value::String(s) => Ok(s),
                other => Err(RecipeError::Invalid {
                    file: path.to_path_buf(),
                    path: "extends".into(),
                    message: format!("expected a list of file paths, found {}", other.type_str()),
                }),
            })
            .collect::<Result<_, _>>()?,
        Some(Value::String(s)) => vec![s],
        Some(other) => {
            return Err(RecipeError::Invalid {
                file: path.to_path_buf(),
                path: "extends".into(),
                message: format!("expected a list of file paths, found {}", other.type_str()),
            });
        }
    };
    stack.push(key);
    let dir = path.parent().unwrap_or(Path::new("."));
    for base in extends {
        load_into(composed, &dir.join(base), Some(path), stack)?;
    }
    stack.pop();
    merge(&mut composed.table, table, "", path, &mut composed.origins);
    Ok(())
}

/// Deep-merges `from` into `into`: tables merge key by key, anything else replaces.
fn merge(into: &mut Table, from: Table, prefix: &str, file: &Path, origins: &mut BTreeMap<String, PathBuf>) {
    for (key, value) in from {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match (into.get_mut(&key), value) {
            (Some(Value::Table(existing)), Value::Table(new)) => merge(existing, new, &path, file, origins),
            (_, value) => {
                origins.retain(|k, _| {
                    !(k == &path || k.starts_with(&format!("{path}.")) || k.starts_with(&format!("{path}[")))
                });
                record(&value, &path, file, origins);
                into.insert(key, value);
            }
        }
    }
}

fn record(value: &Value, path: &str, file: &Path, origins: &mut BTreeMap<String, PathBuf>) {
    origins.insert(path.to_string(), file.to_path_buf());
    if let Value::Table(t) = value {
        for (k, v) in t {
            record(v, &format!("{path}.{k}"), file, origins);
        }
    }
}

fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn table(text: &str) -> Table {
        text.parse().unwrap()
    }

    fn merged(base: &str, top: &str) -> Table {
        let mut into = table(base);
        merge(&mut into, table(top), "", Path::new("top.toml"), &mut BTreeMap::new());
        into
    }

    #[test]
    fn tables_merge_and_scalars_and_arrays_replace() {
        let out = merged("[a]\nx = 1\ny = [1, 2]\n[b]\nz = true", "[a]\ny = [3]\nw = \"s\"");
        assert_eq!(out, table("[a]\nx = 1\ny = [3]\nw = \"s\"\n[b]\nz = true"));
    }

    #[test]
    fn overrides_parse_toml_values_or_fall_back_to_strings() {
        let mut c = Composed {
            table: table("[algorithm]\nclip_coef = 0.2"),
            origins: BTreeMap::new(),
        };
        c.apply_override("algorithm.clip_coef=0.3").unwrap();
        c.apply_override("model.hidden=[32, 32]").unwrap();
        c.apply_override("env.plugin=cartpole").unwrap();
        assert_eq!(
            c.table,
            table("[algorithm]\nclip_coef = 0.3\n[model]\nhidden = [32, 32]\n[env]\nplugin = \"cartpole\"")
        );
        assert_eq!(c.origin("model.hidden"), PathBuf::from("--set"));
        assert!(matches!(c.apply_override("novalue"), Err(RecipeError::Override { .. })));
        assert!(matches!(
            c.apply_override("algorithm.clip_coef.x=1"),
            Err(RecipeError::Override { .. })
        ));
        assert!(matches!(c.apply_override("a..b=1"), Err(RecipeError::Override { .. })));
    }

    #[test]
    fn line_and_column_are_one_based() {
        assert_eq!(line_column("ab\ncd", 4), (2, 2));
        assert_eq!(line_column("x", 0), (1, 1));
    }

    fn toml_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            any::<i32>().prop_map(|i| Value::Integer(i.into())),
            "[a-z]{0,4}".prop_map(Value::String),
            any::<bool>().prop_map(Value::Boolean)
        ];
        leaf.prop_recursive(3, 16, 3, |inner| {
            prop::collection::btree_map("[a-c]", inner, 0..3).prop_map(|m| Value::Table(m.into_iter().collect()))
        })
    }

    fn toml_table() -> impl Strategy<Value = Table> {
        prop::collection::btree_map("[a-c]", toml_value(), 0..4).prop_map(|m| m.into_iter().collect())
    }

    /// Looks a dotted path up in a table.
    fn lookup<'a>(t: &'a Table, path: &[String]) -> Option<&'a Value> {
        let (first, rest) = path.split_first()?;
        let v = t.get(first)?;
        if rest.is_empty() {
            Some(v)
        } else {
            lookup(v.as_table()?, rest)
        }
    }

    fn leaves(t: &Table, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Value)>) {
        for (k, v) in t {
            let mut p = prefix.clone();
            p.push(k.clone());
            match v {
                // An empty table sets nothing: merging it changes nothing.
                Value::Table(inner) => leaves(inner, p, out),
                other => out.push((p, other.clone())),
            }
        }
    }

    proptest! {
        #[test]
        fn the_later_layer_wins_and_nothing_else_is_lost(base in toml_table(), top in toml_table()) {
            let mut out = base.clone();
            merge(&mut out, top.clone(), "", Path::new("t"), &mut BTreeMap::new());
            // Every leaf of the top layer is present as written.
            let mut top_leaves = Vec::new();
            leaves(&top, vec![], &mut top_leaves);
            for (path, value) in &top_leaves {
                prop_assert_eq!(lookup(&out, path), Some(value));
            }
            // Every leaf of the base survives unless the top layer set that path or a prefix of it
            // to something that is not a table.
            let mut base_leaves = Vec::new();
            leaves(&base, vec![], &mut base_leaves);
            for (path, value) in &base_leaves {
                let shadowed = (1..=path.len()).any(|n| lookup(&top, &path[..n]).is_some_and(|v| !v.is_table() || n == path.len()));
                if !shadowed {
                    prop_assert_eq!(lookup(&out, path), Some(value));
                }
            }
            // Merging is idempotent for the same top layer.
            let mut again = out.clone();
            merge(&mut again, top, "", Path::new("t"), &mut BTreeMap::new());
            prop_assert_eq!(again, out);
        }
    }
}

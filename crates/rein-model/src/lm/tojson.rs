//! The `tojson` filter of transformers' chat-template environment: Python's `json.dumps` with
//! `ensure_ascii=False`, keys in the order given, `", "` and `": "` between items (or `indent`
//! spaces per level), nothing escaped for HTML. minijinja's own `tojson` sorts nothing but
//! writes compactly and escapes `<`, `>`, `&` and `'`, so templates that list tool schemas
//! (Qwen2.5's) would render other text than the model was trained on.

use std::io;

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde::Serialize;
use serde_json::ser::{Formatter, PrettyFormatter, Serializer};

/// `json.dumps`' default separators: a space after `,` and `:`.
struct PythonFormatter;

impl Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if first { Ok(()) } else { writer.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if first { Ok(()) } else { writer.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b": ")
    }
}

/// `value | tojson` or `value | tojson(indent=N)`.
pub(super) fn tojson(value: Value, kwargs: Kwargs) -> Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let fail = |e: serde_json::Error| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}"));
    let mut out = Vec::new();
    match indent {
        None => value.serialize(&mut Serializer::with_formatter(&mut out, PythonFormatter)),
        Some(n) => {
            let spaces = vec![b' '; n];
            value.serialize(&mut Serializer::with_formatter(
                &mut out,
                PrettyFormatter::with_indent(&spaces),
            ))
        }
    }
    .map_err(fail)?;
    String::from_utf8(out).map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, value: serde_json::Value) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        env.render_str(source, minijinja::context! { x => value }).unwrap()
    }

    #[test]
    fn renders_as_pythons_json_dumps() {
        let value: serde_json::Value =
            serde_json::from_str(r#"{"b": [1, 2.5, null, true], "a": "it's <b> & \"q\"\n — ü", "c": {}}"#).unwrap();
        assert_eq!(
            render("{{ x | tojson }}", value.clone()),
            r#"{"b": [1, 2.5, null, true], "a": "it's <b> & \"q\"\n — ü", "c": {}}"#
        );
        assert_eq!(
            render("{{ x | tojson(indent=2) }}", value),
            "{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"a\": \"it's <b> & \\\"q\\\"\\n — ü\",\n  \"c\": {}\n}"
        );
    }
}

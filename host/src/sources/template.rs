//! Field paths inside a JSON value and the event-type template a source
//! renders over an outbox entry's fields (a CouchDB entry's `event-type`,
//! a Neo4j node's `event.type`).
//!
//! Owns the dotted-path lookup ([`at_path`]) and the `{field}` template
//! ([`Template`]); each source parses its template to check the
//! configuration and renders it per entry.
//!
//! Must never: know an entry shape's rules (what makes an entry malformed
//! lives with each source).

use serde_json::Value;

/// The value at dotted `path` under `value`.
pub fn at_path<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(value, |v, key| v.get(key))
}

/// The `event-type` template: literal text with `{field}` placeholders,
/// each replaced by the entry's field of that name (a string or number).
#[derive(Debug, Clone)]
pub struct Template {
    parts: Vec<(bool, String)>,
}

impl Template {
    /// Parse `text`. Errors say where it is wrong.
    pub fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(start) = rest.find('{') {
            if start > 0 {
                parts.push((false, rest[..start].to_string()));
            }
            let after = &rest[start + 1..];
            let end = after
                .find('}')
                .ok_or_else(|| format!("{text:?}: `{{` is never closed"))?;
            let name = &after[..end];
            if name.is_empty() || name.contains('{') {
                return Err(format!("{text:?}: `{{{name}}}` is not a field name"));
            }
            parts.push((true, name.to_string()));
            rest = &after[end + 1..];
        }
        if rest.contains('}') {
            return Err(format!("{text:?}: `}}` without `{{`"));
        }
        if !rest.is_empty() {
            parts.push((false, rest.to_string()));
        }
        if parts.is_empty() {
            return Err("must not be empty".into());
        }
        Ok(Template { parts })
    }

    /// The text for `entry`; errors name a field that is missing or not a
    /// string or number.
    pub fn render(&self, entry: &Value) -> Result<String, String> {
        let mut out = String::new();
        for (field, text) in &self.parts {
            if !field {
                out.push_str(text);
                continue;
            }
            match at_path(entry, text) {
                Some(Value::String(s)) if !s.is_empty() => out.push_str(s),
                Some(Value::Number(n)) => out.push_str(&n.to_string()),
                _ => return Err(format!("field {text:?} is missing or not a string")),
            }
        }
        Ok(out)
    }
}

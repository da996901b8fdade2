//! Every configuration key `outboxd run` accepts, found by asking the
//! code's own config types rather than by reading a list.
//!
//! Every config table refuses unknown keys, and serde's refusal names the
//! keys the table does take ("unknown field `zz-probe`, expected one of
//! `a`, `b`"). So the probe writes a table holding only an unknown key at
//! each place of the configuration, reads the accepted keys from the
//! refusal, and goes down into each key that is itself a table (or an
//! array of tables: `routes[]`). `[sources.NAME]` tables are probed once
//! per `kind` ([`outboxd::sources::KINDS`]), their keys written
//! `sources.NAME.KEY`.

use std::collections::BTreeSet;

use outboxd::config::Config;

/// The key no table accepts.
const PROBE: &str = "zz-probe";

/// One step of the path to a table: a key, or a key holding an array of
/// tables (written `key[]`).
#[derive(Clone, Debug)]
enum Step {
    Table(String),
    Array(String),
    /// `[sources.NAME]` with `kind` set.
    Source(String),
}

/// The TOML document with `leaf` at the end of `path`.
fn document(path: &[Step], leaf: toml::Value) -> toml::Value {
    let mut value = leaf;
    for step in path.iter().rev() {
        let mut table = toml::map::Map::new();
        match step {
            Step::Table(key) => {
                table.insert(key.clone(), value);
            }
            Step::Array(key) => {
                table.insert(key.clone(), toml::Value::Array(vec![value]));
            }
            Step::Source(kind) => {
                if let toml::Value::Table(mut inner) = value {
                    inner.insert("kind".into(), toml::Value::String(kind.clone()));
                    let mut sources = toml::map::Map::new();
                    sources.insert("NAME".into(), toml::Value::Table(inner));
                    table.insert("sources".into(), toml::Value::Table(sources));
                }
            }
        }
        value = toml::Value::Table(table);
    }
    value
}

/// A table holding only the unknown key.
fn probe_table() -> toml::Value {
    let mut table = toml::map::Map::new();
    table.insert(PROBE.into(), toml::Value::Integer(1));
    toml::Value::Table(table)
}

/// The keys serde says the table at the end of `path` takes, or `None`
/// when no table is there (a plain value, a list of strings, a map).
fn accepted(path: &[Step]) -> Option<Vec<String>> {
    let text = toml::to_string(&document(path, probe_table())).unwrap();
    let error = match toml::from_str::<Config>(&text) {
        Ok(_) => return None,
        Err(e) => e.to_string(),
    };
    let marker = format!("unknown field `{PROBE}`");
    let at = error.find(&marker)?;
    let rest = &error[at + marker.len()..];
    let rest = rest.lines().next().unwrap_or("");
    Some(
        rest.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect(),
    )
}

/// Display form of a path plus a key: `delivery.lease`, `routes[].types`,
/// `sources.NAME.url`.
fn name(path: &[Step], key: &str) -> String {
    let mut parts: Vec<String> = path
        .iter()
        .map(|s| match s {
            Step::Table(k) => k.clone(),
            Step::Array(k) => format!("{k}[]"),
            Step::Source(_) => "sources.NAME".to_string(),
        })
        .collect();
    parts.push(key.to_string());
    parts.join(".")
}

fn walk(path: Vec<Step>, out: &mut BTreeSet<String>) {
    let Some(keys) = accepted(&path) else { return };
    for key in keys {
        if path.is_empty() && key == "sources" {
            out.insert("sources.NAME.kind".to_string());
            for kind in outboxd::sources::KINDS {
                walk(vec![Step::Source(kind.to_string())], out);
            }
            continue;
        }
        let mut table = path.clone();
        table.push(Step::Table(key.clone()));
        if accepted(&table).is_some() {
            walk(table, out);
            continue;
        }
        let mut array = path.clone();
        array.push(Step::Array(key.clone()));
        if accepted(&array).is_some() {
            walk(array, out);
            continue;
        }
        out.insert(name(&path, &key));
    }
}

/// Every leaf key the configuration accepts, dotted from the top:
/// `listen`, `delivery.lease`, `routes[].sinks`, `sources.NAME.queue`,
/// `sources.NAME.bindings[].exchange`. A table is listed by its leaves.
pub fn accepted_keys() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    walk(Vec::new(), &mut out);
    out
}

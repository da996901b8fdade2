//! The design document holding the `pending` view, and its install.
//!
//! The view's contract: for every entry whose status is the pending value,
//! it emits the key `[document id, entry sequence]` (value `null`), so the
//! view lists exactly the pending entries, ordered by document and then by
//! sequence. The map function is generated from the configured paths; a
//! design document whose map function differs is outdated and replaced.
//!
//! Must never: touch other design documents.

use serde_json::{json, Value};

use super::client::{Client, CouchError};
use super::config::CouchdbConfig;

/// The view's name inside the design document.
pub const VIEW: &str = "pending";

/// Attempts at installing the design document when others keep writing it.
const INSTALL_ATTEMPTS: u32 = 5;

/// The JavaScript map function of the `pending` view for `config`'s paths.
pub fn map_function(config: &CouchdbConfig) -> String {
    let p = &config.paths;
    let path: Vec<&str> = p.entries.split('.').collect();
    let field = |f: &str| json!(f.split('.').collect::<Vec<_>>()).to_string();
    format!(
        "function (doc) {{\n\
         \x20 function get(v, path) {{ for (var i = 0; i < path.length; i++) {{ if (v === null || typeof v !== 'object') return undefined; v = v[path[i]]; }} return v; }}\n\
         \x20 var entries = get(doc, {entries});\n\
         \x20 if (!Array.isArray(entries)) return;\n\
         \x20 for (var i = 0; i < entries.length; i++) {{\n\
         \x20   var e = entries[i];\n\
         \x20   if (e !== null && typeof e === 'object' && get(e, {status}) === {pending}) {{\n\
         \x20     var seq = get(e, {sequence});\n\
         \x20     emit([doc._id, seq === undefined ? null : seq], null);\n\
         \x20   }}\n\
         \x20 }}\n\
         }}",
        entries = json!(path),
        status = field(&p.status),
        pending = json!(p.pending),
        sequence = field(&p.sequence),
    )
}

/// Install `_design/<design-document>` when it is missing or its `pending`
/// view's map function is not [`map_function`]. Returns whether it wrote.
pub async fn ensure(client: &Client, config: &CouchdbConfig) -> Result<bool, CouchError> {
    let map = map_function(config);
    let name = &config.design_document;
    for _ in 0..INSTALL_ATTEMPTS {
        let current = client.design(name).await?;
        let mut doc = match &current {
            Some(d)
                if d.pointer(&format!("/views/{VIEW}/map"))
                    .and_then(Value::as_str)
                    == Some(map.as_str()) =>
            {
                return Ok(false)
            }
            Some(d) => d.clone(),
            None => json!({ "_id": format!("_design/{name}") }),
        };
        doc["language"] = json!("javascript");
        if !doc.get("views").is_some_and(Value::is_object) {
            doc["views"] = json!({});
        }
        doc["views"][VIEW] = json!({ "map": map });
        if client.put_design(name, &doc).await? {
            tracing::info!(design = %format!("_design/{name}"), replaced = current.is_some(), "installed the pending view");
            return Ok(true);
        }
    }
    Err(CouchError::Answer {
        what: "PUT /{db}/_design/{ddoc}".into(),
        problem: format!(
            "409 conflict {INSTALL_ATTEMPTS} times in a row: another writer keeps changing it"
        ),
    })
}

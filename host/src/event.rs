//! The event model: CloudEvents 1.0 in, validated, with its canonical
//! content hash.
//!
//! Owns: parsing the CloudEvents JSON format (spec "JSON Event Format" 1.0.2)
//! into [`NewEvent`], every ingest-time validation rule with an error naming
//! the attribute, the stream key rule, and what "the same event" means
//! ([`NewEvent::content_hash`], [`NewEvent::differences`]).
//!
//! Must never: touch the database or the network. A value refused here is
//! refused before anything is written.
//!
//! The canonical content covers: `source`, `type`, `subject`, `time` (as the
//! producer gave it, or absent), `datacontenttype`, `dataschema`, the stream,
//! the producer-supplied `sequence` (absent when outboxd assigns it), every
//! other extension (sorted by name), and `data`. JSON data (no
//! `datacontenttype`, `application/json` or any `+json` type) is compared as
//! canonical JSON — object keys sorted, no insignificant whitespace, numbers
//! as parsed — so key order and spacing do not make two events different.
//! Other data is compared byte for byte. `specversion`, the `id` itself
//! and the trace context (the `traceparent` and `tracestate` extensions:
//! where the event was sent from, not what it is — a producer that resends
//! an event from a new trace sends the same event) are not part of the
//! content.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

/// Longest accepted `id`, in bytes.
pub const MAX_ID_BYTES: usize = 256;
/// Longest accepted stream key, in bytes.
pub const MAX_STREAM_BYTES: usize = 256;
/// Longest accepted text attribute other than `id` and the stream, in bytes.
pub const MAX_ATTRIBUTE_BYTES: usize = 4096;

/// How `data` was given, so it can be handed back in the same JSON form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataFormat {
    /// `data` held a JSON value of a JSON content type; kept as its JSON text.
    Json,
    /// `data` held a JSON string of a non-JSON content type; kept as the
    /// string's UTF-8 bytes.
    Text,
    /// `data_base64`; kept as the decoded bytes.
    Binary,
    /// No data.
    None,
}

impl DataFormat {
    /// Name used in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            DataFormat::Json => "json",
            DataFormat::Text => "text",
            DataFormat::Binary => "binary",
            DataFormat::None => "none",
        }
    }

    /// Inverse of [`DataFormat::as_str`]; unknown names read as binary.
    pub fn parse(s: &str) -> DataFormat {
        match s {
            "json" => DataFormat::Json,
            "text" => DataFormat::Text,
            "none" => DataFormat::None,
            _ => DataFormat::Binary,
        }
    }
}

/// A validated event, as received, before the store gives it a sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// CloudEvents `id` (§3.1.1): unique within its `source`.
    pub id: String,
    /// CloudEvents `source` (§3.1.1): a URI-reference.
    pub source: String,
    /// CloudEvents `type` (§3.1.1).
    pub ty: String,
    /// CloudEvents `subject` (§3.1.2), if given.
    pub subject: Option<String>,
    /// Producer's `time` (RFC 3339), if given.
    pub time: Option<String>,
    /// CloudEvents `datacontenttype` (§3.1.2, RFC 2046), if given.
    pub datacontenttype: Option<String>,
    /// CloudEvents `dataschema` (§3.1.2, a URI), if given.
    pub dataschema: Option<String>,
    /// Ordering key: `partitionkey`, else `subject`, else `source`.
    pub stream: String,
    /// Producer-supplied position in the stream (`sequence` extension).
    pub sequence: Option<u64>,
    /// Other extension attributes, as text.
    pub extensions: BTreeMap<String, String>,
    /// The payload as received: JSON text, or the bytes of `data_base64`.
    pub data: Vec<u8>,
    /// How `data` was given (JSON, text or binary).
    pub data_format: DataFormat,
}

/// An input problem, naming the attribute (or header) at fault. Ingest
/// answers it with 400.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct EventError {
    /// The attribute, e.g. `id`, `data_base64`, `extensions.foo`.
    pub field: String,
    /// What is wrong, e.g. `is required`.
    pub problem: String,
}

fn err(field: &str, problem: impl Into<String>) -> EventError {
    EventError {
        field: field.to_string(),
        problem: problem.into(),
    }
}

/// True when `datacontenttype` says the data is JSON (absent counts as JSON,
/// per the JSON format spec §3.1).
pub fn is_json_content_type(ct: Option<&str>) -> bool {
    match ct {
        None => true,
        Some(ct) => {
            let essence = ct
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            essence == "application/json" || essence == "text/json" || essence.ends_with("+json")
        }
    }
}

/// The CloudEvents Integer range (CloudEvents 1.0 spec, "Type System":
/// a whole number from -2,147,483,648 to +2,147,483,647, 32-bit signed).
pub const CE_INTEGER_MIN: i64 = i32::MIN as i64;
/// See [`CE_INTEGER_MIN`].
pub const CE_INTEGER_MAX: i64 = i32::MAX as i64;

/// A `token` character of a media type (RFC 2045 §5.1, as RFC 7230 §3.2.6
/// lists them): visible ASCII except separators.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_token(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(is_tchar)
}

/// Check that `s` is a media type as RFC 2046 §1 / RFC 2045 §5.1 write it:
/// `type "/" subtype *( OWS ";" OWS name "=" ( token / quoted-string ) )`.
/// The error says what is wrong, for `datacontenttype`.
pub fn check_media_type(s: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "must be a media type (RFC 2046) such as \"application/json\" or \"text/plain; charset=utf-8\", got {s:?}: {why}"
        ))
    };
    let (essence, mut rest) = match s.find(';') {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, ""),
    };
    let Some((ty, subtype)) = essence.trim_end().split_once('/') else {
        return bad("no \"/\" between type and subtype");
    };
    if !is_token(ty) || !is_token(subtype) {
        return bad("type and subtype must be non-empty tokens");
    }
    while !rest.is_empty() {
        // `rest` starts with ';' here.
        rest = rest[1..].trim_start_matches([' ', '\t']);
        let Some(eq) = rest.find('=') else {
            return bad("a parameter has no \"=\"");
        };
        if !is_token(&rest[..eq]) {
            return bad("a parameter name must be a token");
        }
        rest = &rest[eq + 1..];
        if let Some(quoted) = rest.strip_prefix('"') {
            // quoted-string: up to the closing quote; `\` escapes one byte.
            let bytes = quoted.as_bytes();
            let mut i = 0;
            let mut closed = None;
            while i < bytes.len() {
                match bytes[i] {
                    b'\\' => i += 2,
                    b'"' => {
                        closed = Some(i);
                        break;
                    }
                    _ => i += 1,
                }
            }
            let Some(end) = closed else {
                return bad("a quoted parameter value is not closed");
            };
            rest = &quoted[end + 1..];
        } else {
            let end = rest.find([';', ' ', '\t']).unwrap_or(rest.len());
            if !is_token(&rest[..end]) {
                return bad("a parameter value must be a token or a quoted string");
            }
            rest = &rest[end..];
        }
        rest = rest.trim_start_matches([' ', '\t']);
        if !rest.is_empty() && !rest.starts_with(';') {
            return bad("parameters are separated by \";\"");
        }
    }
    Ok(())
}

/// Check that `s` is an absolute URI (RFC 3986 §4.3): a scheme (a letter,
/// then letters, digits, `+`, `-`, `.`), `:`, and no whitespace or control
/// characters.
fn check_uri(s: &str) -> Result<(), String> {
    let scheme = &s[..s.find(':').unwrap_or(0)];
    let scheme_ok = scheme
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic())
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-' || b == b'.');
    if !scheme_ok {
        return Err(format!(
            "must be an absolute URI (RFC 3986) such as \"https://example.com/schema.json\", got {s:?}"
        ));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "must be a URI (RFC 3986) without spaces or control characters, got {s:?}"
        ));
    }
    Ok(())
}

fn text_attr(name: &str, raw: &RawValue, max: usize) -> Result<String, EventError> {
    let value: String =
        serde_json::from_str(raw.get()).map_err(|_| err(name, "must be a JSON string"))?;
    check_text(name, &value, max)?;
    Ok(value)
}

fn check_text(name: &str, value: &str, max: usize) -> Result<(), EventError> {
    if value.contains('\0') {
        return Err(err(name, "must not contain NUL (\\u0000) characters"));
    }
    if value.len() > max {
        return Err(err(
            name,
            format!("is {} bytes, over the limit of {max}", value.len()),
        ));
    }
    Ok(())
}

impl NewEvent {
    /// Parse one event in the CloudEvents JSON format from its JSON text.
    ///
    /// Errors name the attribute: missing `id`/`source`/`type`/
    /// `specversion`, `specversion` other than `1.0`, wrong JSON types, NUL
    /// characters in text attributes, over-long `id` or stream key, bad
    /// `data_base64`, both `data` and `data_base64`.
    pub fn from_json(raw: &RawValue) -> Result<NewEvent, EventError> {
        let attrs: BTreeMap<String, Box<RawValue>> =
            serde_json::from_str(raw.get()).map_err(|_| err("event", "must be a JSON object"))?;
        // The attribute table of the CloudEvents 1.0 spec ("Context
        // Attributes"), rule by rule, in `required_attributes` and
        // `optional_attributes`. The JSON format (json-format.md §2.2,
        // "Type System Mapping") carries String, URI, URI-reference and
        // Timestamp as JSON strings, Integer as a JSON number, Boolean as
        // true/false; `null` for an OPTIONAL attribute means absent.
        let (id, source, ty) = required_attributes(&attrs)?;
        let Optional {
            subject,
            time,
            datacontenttype,
            dataschema,
        } = optional_attributes(&attrs)?;

        let OtherAttributes {
            partitionkey,
            sequence,
            extensions,
        } = other_attributes(&attrs)?;

        let stream = partitionkey
            .or_else(|| subject.clone())
            .unwrap_or_else(|| source.clone());
        if stream.is_empty() {
            return Err(err("partitionkey", "the stream key must not be empty"));
        }
        check_text("partitionkey", &stream, MAX_STREAM_BYTES)?;

        let json_data = is_json_content_type(datacontenttype.as_deref());
        let (data, data_format) = event_data(&attrs, json_data)?;

        Ok(NewEvent {
            id,
            source,
            ty,
            subject,
            time,
            datacontenttype,
            dataschema,
            stream,
            sequence,
            extensions,
            data,
            data_format,
        })
    }

    /// The data in canonical form: canonical JSON text for JSON data, the
    /// bytes themselves otherwise.
    pub fn canonical_data(&self) -> Vec<u8> {
        canonical_data(&self.data, self.data_format)
    }

    /// SHA-256 over the canonical content (see the module note), as 64 hex
    /// digits. Two events with the same id are "the same event" exactly when
    /// their hashes are equal.
    pub fn content_hash(&self) -> String {
        let mut h = Sha256::new();
        let mut field = |name: &str, value: Option<&[u8]>| {
            h.update(name.as_bytes());
            match value {
                None => h.update([0u8]),
                Some(v) => {
                    h.update([1u8]);
                    h.update((v.len() as u64).to_be_bytes());
                    h.update(v);
                }
            }
        };
        field("source", Some(self.source.as_bytes()));
        field("type", Some(self.ty.as_bytes()));
        field("subject", self.subject.as_deref().map(str::as_bytes));
        field("time", self.time.as_deref().map(str::as_bytes));
        field(
            "datacontenttype",
            self.datacontenttype.as_deref().map(str::as_bytes),
        );
        field("dataschema", self.dataschema.as_deref().map(str::as_bytes));
        field("stream", Some(self.stream.as_bytes()));
        let seq = self.sequence.map(|s| s.to_string());
        field("sequence", seq.as_deref().map(str::as_bytes));
        for (k, v) in self.extensions.iter().filter(|(k, _)| !is_trace_context(k)) {
            field(&format!("ext:{k}"), Some(v.as_bytes()));
        }
        field("data", Some(&self.canonical_data()));
        hex::encode(h.finalize())
    }

    /// The attributes in which `self` differs from `other`, by CloudEvents
    /// name (`data` for the payload, `sequence` for a producer sequence,
    /// `partitionkey` for the stream key). Empty when they are the same event.
    pub fn differences(&self, other: &NewEvent) -> Vec<String> {
        let mut out = Vec::new();
        let mut cmp = |name: &str, same: bool| {
            if !same {
                out.push(name.to_string());
            }
        };
        cmp("source", self.source == other.source);
        cmp("type", self.ty == other.ty);
        cmp("subject", self.subject == other.subject);
        cmp("time", self.time == other.time);
        cmp(
            "datacontenttype",
            self.datacontenttype == other.datacontenttype,
        );
        cmp("dataschema", self.dataschema == other.dataschema);
        cmp("partitionkey", self.stream == other.stream);
        cmp("sequence", self.sequence == other.sequence);
        let keys: std::collections::BTreeSet<&String> = self
            .extensions
            .keys()
            .chain(other.extensions.keys())
            .collect();
        for k in keys.into_iter().filter(|k| !is_trace_context(k)) {
            cmp(k, self.extensions.get(k) == other.extensions.get(k));
        }
        cmp("data", self.canonical_data() == other.canonical_data());
        out
    }
}

/// Whether extension `name` is the trace context (CloudEvents
/// distributed-tracing extension), left out of the content.
fn is_trace_context(name: &str) -> bool {
    name == "traceparent" || name == "tracestate"
}

/// Canonical form of stored data (see [`NewEvent::canonical_data`]).
pub fn canonical_data(data: &[u8], format: DataFormat) -> Vec<u8> {
    if format == DataFormat::Json {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
            // serde_json's Map is a BTreeMap here (no `preserve_order`), so
            // keys come out sorted and whitespace is dropped.
            return serde_json::to_vec(&v).unwrap_or_else(|_| data.to_vec());
        }
    }
    data.to_vec()
}

/// The attributes of an event beyond the spec's own.
struct OtherAttributes {
    /// `partitionkey`: the Partitioning extension, the stream key.
    partitionkey: Option<String>,
    /// `sequence`: outboxd's position in the stream.
    sequence: Option<u64>,
    /// Every extension attribute, as text.
    extensions: BTreeMap<String, String>,
}

/// The attributes beyond the spec's own ([`OtherAttributes`]), checked.
fn other_attributes(
    attrs: &BTreeMap<String, Box<RawValue>>,
) -> Result<OtherAttributes, EventError> {
    let mut partitionkey = None;
    let mut sequence = None;
    let mut extensions = BTreeMap::new();
    for (name, value) in attrs {
        match name.as_str() {
            "specversion" | "id" | "source" | "type" | "subject" | "time" | "datacontenttype"
            | "dataschema" | "data" | "data_base64" => {}
            // partitionkey: the Partitioning extension (String), the
            // stream key.
            "partitionkey" => {
                partitionkey = Some(text_attr("partitionkey", value, MAX_STREAM_BYTES)?)
            }
            // sequence: outboxd's own position in the stream, an
            // integer or a string of digits from 1 to 2^63-1; not the
            // CloudEvents Integer range.
            "sequence" => sequence = Some(parse_sequence(value)?),
            // Extension context attributes ("Extension Context
            // Attributes"), named per "Attribute Naming Convention"
            // (lower-case a-z and 0-9; 20 characters recommended, 64
            // accepted here), typed by the type system.
            _ => {
                let field = format!("extensions.{name}");
                if name.is_empty()
                    || name.len() > 64
                    || !name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                {
                    return Err(err(
                        &field,
                        "extension names are lower-case letters and digits (CloudEvents §3.1.1)",
                    ));
                }
                let Some(text) = extension_value(&field, value)? else {
                    continue;
                };
                check_text(&field, &text, MAX_ATTRIBUTE_BYTES)?;
                extensions.insert(name.clone(), text);
            }
        }
    }
    Ok(OtherAttributes {
        partitionkey,
        sequence,
        extensions,
    })
}

/// The value of extension attribute `field` as text, by the CloudEvents
/// type system (json-format.md §2.2): a string as is, a JSON number as a
/// CloudEvents Integer (whole, 32-bit signed), a boolean as `true`/`false`;
/// `None` for `null` (absent). Errors name the field.
fn extension_value(field: &str, value: &RawValue) -> Result<Option<String>, EventError> {
    let text = match serde_json::from_str::<serde_json::Value>(value.get()) {
        Ok(serde_json::Value::String(s)) => s,
        // A JSON number is a CloudEvents Integer (json-format.md
        // §2.2): whole and 32-bit signed. There is no float type.
        Ok(serde_json::Value::Number(n)) => match n.as_i64() {
            Some(i) if (CE_INTEGER_MIN..=CE_INTEGER_MAX).contains(&i) => {
                i.to_string()
            }
            Some(_) => {
                return Err(err(field, format!(
                    "{n} is outside the CloudEvents Integer range ({CE_INTEGER_MIN} to {CE_INTEGER_MAX}); send it as a string"
                )))
            }
            None => {
                return Err(err(field, format!(
                    "{n} is not a whole number: a JSON number is a CloudEvents Integer (there is no float type); send it as a string"
                )))
            }
        },
        Ok(serde_json::Value::Bool(b)) => b.to_string(),
        Ok(serde_json::Value::Null) => return Ok(None),
        _ => return Err(err(field, "must be a string, number or boolean")),
    };
    Ok(Some(text))
}

/// The event's data and its format: `data` as JSON text for JSON content
/// types (`json_data`), a JSON string as its text otherwise; `data_base64`
/// decoded; nothing for neither or `null`. Both at once is an error.
fn event_data(
    attrs: &BTreeMap<String, Box<RawValue>>,
    json_data: bool,
) -> Result<(Vec<u8>, DataFormat), EventError> {
    let data = match (attrs.get("data"), attrs.get("data_base64")) {
        (Some(_), Some(_)) => {
            return Err(err("data_base64", "must not be given together with data"))
        }
        (Some(d), None) if d.get() == "null" => (Vec::new(), DataFormat::None),
        (Some(d), None) if json_data => (d.get().as_bytes().to_vec(), DataFormat::Json),
        (Some(d), None) => match serde_json::from_str::<serde_json::Value>(d.get()) {
            Ok(serde_json::Value::String(s)) => (s.into_bytes(), DataFormat::Text),
            // A non-string value with a non-JSON content type: keep the JSON text.
            _ => (d.get().as_bytes().to_vec(), DataFormat::Json),
        },
        (None, Some(b)) => {
            let text: String = serde_json::from_str(b.get())
                .map_err(|_| err("data_base64", "must be a JSON string"))?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|e| err("data_base64", format!("is not valid base64: {e}")))?;
            (bytes, DataFormat::Binary)
        }
        (None, None) => (Vec::new(), DataFormat::None),
    };
    Ok(data)
}

fn parse_sequence(raw: &RawValue) -> Result<u64, EventError> {
    let problem = "must be a non-negative integer, or a string of decimal digits, below 2^63";
    let n = match serde_json::from_str::<serde_json::Value>(raw.get()) {
        Ok(serde_json::Value::Number(n)) => n.as_u64(),
        Ok(serde_json::Value::String(s))
            if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) =>
        {
            s.parse::<u64>().ok()
        }
        _ => None,
    };
    match n {
        Some(n) if n > 0 && n <= i64::MAX as u64 => Ok(n),
        Some(0) => Err(err("sequence", "must be at least 1")),
        _ => Err(err("sequence", problem)),
    }
}

/// Parse a batch in the CloudEvents JSON batch format (json-format.md §4):
/// a JSON array of events, possibly empty. Errors are prefixed with the
/// item index (`[3].id: is required`).
pub fn parse_batch(body: &[u8]) -> Result<Vec<NewEvent>, EventError> {
    let items: Vec<Box<RawValue>> = serde_json::from_slice(body)
        .map_err(|e| err("body", format!("is not a JSON array of events: {e}")))?;
    items
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            NewEvent::from_json(raw).map_err(|e| EventError {
                field: format!("[{i}].{}", e.field),
                problem: e.problem,
            })
        })
        .collect()
}

/// Parse a single event in the CloudEvents JSON format.
pub fn parse_one(body: &[u8]) -> Result<NewEvent, EventError> {
    let raw: Box<RawValue> =
        serde_json::from_slice(body).map_err(|e| err("body", format!("is not valid JSON: {e}")))?;
    NewEvent::from_json(&raw)
}

/// Glob match where `*` matches any run of characters (including none) and
/// every other character matches itself. Used by routes and egress rules.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

/// The OPTIONAL context attributes of CloudEvents 1.0 that outboxd keeps
/// as attributes of their own.
struct Optional {
    subject: Option<String>,
    time: Option<String>,
    datacontenttype: Option<String>,
    dataschema: Option<String>,
}

/// Attribute `name` when present and not `null`, as text.
fn optional_text(
    attrs: &BTreeMap<String, Box<RawValue>>,
    name: &str,
) -> Result<Option<String>, EventError> {
    match attrs.get(name) {
        None => Ok(None),
        Some(v) if v.get() == "null" => Ok(None),
        Some(v) => text_attr(name, v, MAX_ATTRIBUTE_BYTES).map(Some),
    }
}

/// `specversion`, then (`id`, `source`, `type`): the REQUIRED context
/// attributes (CloudEvents 1.0, "REQUIRED Attributes").
fn required_attributes(
    attrs: &BTreeMap<String, Box<RawValue>>,
) -> Result<(String, String, String), EventError> {
    let required = |name: &str| -> Result<&RawValue, EventError> {
        attrs
            .get(name)
            .map(|v| &**v)
            .ok_or_else(|| err(name, "is required"))
    };
    // specversion: REQUIRED, String, non-empty; this is 1.0.
    let specversion = text_attr("specversion", required("specversion")?, 16)?;
    if specversion != "1.0" {
        return Err(err(
            "specversion",
            format!("must be \"1.0\", got {specversion:?}"),
        ));
    }
    // id: REQUIRED, String, non-empty ("REQUIRED Attributes").
    let id = text_attr("id", required("id")?, MAX_ID_BYTES)?;
    if id.is_empty() {
        return Err(err("id", "must not be empty"));
    }
    // source: REQUIRED, URI-reference, non-empty ("REQUIRED
    // Attributes"). A relative reference is allowed: no scheme needed.
    let source = text_attr("source", required("source")?, MAX_ATTRIBUTE_BYTES)?;
    if source.is_empty() {
        return Err(err("source", "must not be empty"));
    }
    // type: REQUIRED, String, non-empty ("REQUIRED Attributes").
    let ty = text_attr("type", required("type")?, MAX_ATTRIBUTE_BYTES)?;
    if ty.is_empty() {
        return Err(err("type", "must not be empty"));
    }
    Ok((id, source, ty))
}

/// `subject`, `time`, `datacontenttype`, `dataschema` (CloudEvents 1.0,
/// "OPTIONAL Attributes": each non-empty when present).
fn optional_attributes(attrs: &BTreeMap<String, Box<RawValue>>) -> Result<Optional, EventError> {
    // subject: OPTIONAL, String, non-empty when present ("OPTIONAL
    // Attributes"), whatever the stream key is.
    let subject = optional_text(attrs, "subject")?;
    if subject.as_deref() == Some("") {
        return Err(err(
            "subject",
            "must not be empty when present (CloudEvents 1.0, subject); leave it out instead",
        ));
    }
    // time: OPTIONAL, Timestamp, RFC 3339 ("Type System"): seconds, and
    // `Z` or a `±hh:mm` offset with hours 00–23.
    let time = optional_text(attrs, "time")?;
    if let Some(t) = &time {
        time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
            .map_err(|_| err("time", format!("must be an RFC 3339 timestamp, got {t:?}")))?;
    }
    // datacontenttype: OPTIONAL, String per RFC 2046, non-empty when
    // present ("OPTIONAL Attributes").
    let datacontenttype = optional_text(attrs, "datacontenttype")?;
    if let Some(ct) = &datacontenttype {
        if ct.is_empty() {
            return Err(err(
                "datacontenttype",
                "must not be empty when present (CloudEvents 1.0, datacontenttype); leave it out for JSON data",
            ));
        }
        check_media_type(ct).map_err(|problem| err("datacontenttype", problem))?;
    }
    // dataschema: OPTIONAL, URI (absolute), non-empty when present
    // ("OPTIONAL Attributes").
    let dataschema = optional_text(attrs, "dataschema")?;
    if let Some(schema) = &dataschema {
        if schema.is_empty() {
            return Err(err(
                "dataschema",
                "must not be empty when present (CloudEvents 1.0, dataschema); leave it out instead",
            ));
        }
        check_uri(schema).map_err(|problem| err("dataschema", problem))?;
    }
    Ok(Optional {
        subject,
        time,
        datacontenttype,
        dataschema,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(json: &str) -> Result<NewEvent, EventError> {
        parse_one(json.as_bytes())
    }

    #[test]
    fn the_trace_context_is_not_part_of_the_content() {
        let base = r#""specversion":"1.0","id":"1","source":"s","type":"t""#;
        let a = ev(&format!(
            "{{{base},\"traceparent\":\"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\"}}"
        ))
        .unwrap();
        let b = ev(&format!("{{{base},\"tracestate\":\"x=1\"}}")).unwrap();
        assert_eq!(a.content_hash(), b.content_hash());
        assert!(a.differences(&b).is_empty());
        let c = ev(&format!("{{{base},\"tenant\":\"x\"}}")).unwrap();
        assert_ne!(a.content_hash(), c.content_hash());
    }

    #[test]
    fn stream_key_prefers_partitionkey_then_subject_then_source() {
        let base = r#""specversion":"1.0","id":"1","source":"s","type":"t""#;
        assert_eq!(
            ev(&format!(
                "{{{base},\"partitionkey\":\"p\",\"subject\":\"x\"}}"
            ))
            .unwrap()
            .stream,
            "p"
        );
        assert_eq!(
            ev(&format!("{{{base},\"subject\":\"x\"}}")).unwrap().stream,
            "x"
        );
        assert_eq!(ev(&format!("{{{base}}}")).unwrap().stream, "s");
    }

    #[test]
    fn missing_attributes_are_named() {
        assert_eq!(
            ev(r#"{"specversion":"1.0","source":"s","type":"t"}"#)
                .unwrap_err()
                .field,
            "id"
        );
        assert_eq!(
            ev(r#"{"specversion":"1.0","id":"1","type":"t"}"#)
                .unwrap_err()
                .field,
            "source"
        );
        assert_eq!(
            ev(r#"{"specversion":"1.0","id":"1","source":"s"}"#)
                .unwrap_err()
                .field,
            "type"
        );
        assert_eq!(
            ev(r#"{"id":"1","source":"s","type":"t"}"#)
                .unwrap_err()
                .field,
            "specversion"
        );
    }

    #[test]
    fn json_data_hash_ignores_key_order_and_whitespace() {
        let a = ev(
            r#"{"specversion":"1.0","id":"1","source":"s","type":"t","data":{"a":1,"b":[1,2]}}"#,
        )
        .unwrap();
        let b = ev(r#"{"specversion":"1.0","id":"1","source":"s","type":"t","data":{ "b" : [1, 2], "a":1 }}"#).unwrap();
        let c = ev(
            r#"{"specversion":"1.0","id":"1","source":"s","type":"t","data":{"a":2,"b":[1,2]}}"#,
        )
        .unwrap();
        assert_eq!(a.content_hash(), b.content_hash());
        assert_ne!(a.content_hash(), c.content_hash());
        assert_eq!(a.differences(&c), vec!["data".to_string()]);
        // raw bytes are kept exactly as sent
        assert_eq!(b.data, br#"{ "b" : [1, 2], "a":1 }"#);
    }

    #[test]
    fn nul_in_text_attribute_is_refused_but_kept_in_json_data() {
        let e =
            ev(r#"{"specversion":"1.0","id":"1","source":"s","type":"t","subject":"a\u0000b"}"#)
                .unwrap_err();
        assert_eq!(e.field, "subject");
        let ok =
            ev(r#"{"specversion":"1.0","id":"1","source":"s","type":"t","data":{"x":"a\u0000b"}}"#)
                .unwrap();
        assert_eq!(ok.data, br#"{"x":"a\u0000b"}"#);
    }

    #[test]
    fn media_types_follow_rfc_2046() {
        for ok in [
            "application/json",
            "text/plain; charset=utf-8",
            "application/cloudevents+json",
            "multipart/form-data; boundary=\"a;b c\"",
            "text/plain;charset=utf-8;format=flowed",
        ] {
            assert_eq!(check_media_type(ok), Ok(()), "{ok}");
        }
        for bad in [
            "xyz",
            "",
            "/json",
            "application/",
            "text plain/x",
            "text/plain; charset",
            "text/plain; =x",
            "text/plain; a=\"open",
            "text/plain; a=b c",
        ] {
            assert!(check_media_type(bad).is_err(), "{bad}");
        }
    }

    /// The attribute table of the CloudEvents 1.0 spec, one case a rule.
    #[test]
    fn attribute_table_rules() {
        let field = |extra: &str| {
            ev(&format!(
                "{{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"s\",\"type\":\"t\",{extra}}}"
            ))
            .err()
            .map(|e| e.field)
        };
        let is =
            |extra: &str, want: &str| assert_eq!(field(extra).as_deref(), Some(want), "{extra}");
        let ok = |extra: &str| assert_eq!(field(extra), None, "{extra}");
        is(r#""datacontenttype":"xyz""#, "datacontenttype");
        is(r#""datacontenttype":"""#, "datacontenttype");
        ok(r#""datacontenttype":"text/plain; charset=utf-8""#);
        is(r#""dataschema":"""#, "dataschema");
        is(r#""dataschema":"schema.json""#, "dataschema");
        ok(r#""dataschema":"https://example.com/s.json""#);
        is(r#""subject":"""#, "subject");
        is(r#""partitionkey":"p","subject":"""#, "subject");
        is(r#""ext":1.5"#, "extensions.ext");
        is(r#""ext":2147483648"#, "extensions.ext");
        is(r#""ext":-2147483649"#, "extensions.ext");
        ok(r#""ext":2147483647"#);
        ok(r#""ext":-2147483648"#);
        ok(r#""ext":true"#);
        ok(r#""sequence":4294967296"#);
        is(r#""time":"2024-01-02T18:31Z""#, "time");
        is(r#""time":"2024-01-02T18:31:00+25:00""#, "time");
        is(r#""time":"2024-01-02T18:31:00+05""#, "time");
        ok(r#""time":"2024-01-02T18:31:00+05:30""#);
        // An empty value is named as such, not as a malformed one.
        for empty in ["datacontenttype", "dataschema", "subject"] {
            let e = ev(&format!(
                "{{\"specversion\":\"1.0\",\"id\":\"1\",\"source\":\"s\",\"type\":\"t\",\"{empty}\":\"\"}}"
            ))
            .unwrap_err();
            assert!(e.problem.contains("must not be empty"), "{e}");
        }
    }

    #[test]
    fn glob() {
        assert!(glob_match("*", "anything"));
        assert!(glob_match("com.github.*", "com.github.issues.opened"));
        assert!(!glob_match("com.github.*", "org.github.x"));
        assert!(glob_match("*.opened", "issues.opened"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
    }
}

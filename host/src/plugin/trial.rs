//! `outboxd plugin run FILE --events events.jsonl`: a plugin author's test
//! loop without a database or a daemon.
//!
//! Owns: reading sample CloudEvents (JSON format, one per line), giving
//! them the stream positions ingest would (a producer's `sequence` kept,
//! else 1, 2, 3… per stream), and running them through the plugin in
//! batches of its `limits.max-batch` — each batch in a fresh sandbox with
//! the manifest's capabilities, limits and resolved configuration, `init`
//! then `deliver`, exactly as the daemon runs it — and printing each
//! outcome. The plugin's log lines go to the log the caller set up.
//!
//! Must never: store, retry or dead-letter anything (each event is tried
//! once; the outcome is only printed), or pass an event that ingest would
//! refuse.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::bindings::{Event, Outcome};
use super::{compile_checked, Manifest, Runtime};

/// Why the events could not be run.
#[derive(Debug, thiserror::Error)]
pub enum TrialError {
    #[error("{file}: cannot read: {source}")]
    /// The events file could not be read.
    Read {
        /// The events file.
        file: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// A line is not an event ingest would accept.
    #[error("{file}:{line}: {problem}")]
    Event {
        /// The events file.
        file: PathBuf,
        /// The line, from 1.
        line: usize,
        /// What ingest would refuse, naming the attribute.
        problem: String,
    },
    /// The CA file given to trust could not be used.
    #[error(transparent)]
    Trust(#[from] super::egress::TrustError),
    /// The plugin could not be loaded (manifest, component or grants).
    #[error("{file}: {reason}")]
    Load {
        /// The manifest.
        file: PathBuf,
        /// Why it could not be loaded.
        reason: String,
    },
}

/// What a run came to, for the exit code.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Events the plugin answered delivered.
    pub delivered: usize,
    /// Events it answered retry.
    pub retry: usize,
    /// Events it rejected.
    pub reject: usize,
    /// Events of batches the plugin failed as a whole (trap, `init`
    /// refused, wrong number of outcomes).
    pub failed: usize,
}

/// Run the events of `events` through the component `file` with its
/// manifest (`manifest`, else the `.toml` beside `file`), its HTTPS
/// trusting the webpki roots and `ca_file`'s certificates (as the
/// daemon's `egress.ca-file`), writing one line per event to `out`:
/// `<id> <stream>#<sequence>: delivered | retry[ after <ms> ms]: <reason> | reject: <reason> | failed: <why>`.
pub async fn run(
    file: &Path,
    manifest: Option<&Path>,
    events: &Path,
    ca_file: Option<&Path>,
    out: &mut dyn Write,
) -> Result<Tally, TrialError> {
    let trust = super::egress::client_tls(&super::egress::EgressConfig {
        ca_file: ca_file.map(Path::to_path_buf),
    })?;
    let batch = read_events(events)?;
    let manifest_path = manifest
        .map(Path::to_path_buf)
        .unwrap_or_else(|| file.with_extension("toml"));
    let load = |file: &Path, reason: String| TrialError::Load {
        file: file.to_path_buf(),
        reason,
    };
    let manifest =
        Manifest::load(&manifest_path).map_err(|e| load(&manifest_path, e.to_string()))?;
    let runtime = Runtime::new()
        .map_err(|e| load(file, format!("cannot start the runtime: {e:#}")))?
        .with_trust(trust);
    let bytes = std::fs::read(file).map_err(|source| TrialError::Read {
        file: file.to_path_buf(),
        source,
    })?;
    let component = compile_checked(&runtime, &bytes).map_err(|r| load(file, r))?;
    let max_batch = manifest.limits.max_batch as usize;
    let plugin = runtime
        .prepare(manifest, &component)
        .map_err(|r| load(file, r))?;
    let mut tally = Tally::default();
    for chunk in batch.chunks(max_batch) {
        let lines: Vec<String> = match plugin.deliver(chunk).await {
            Ok(outcomes) => chunk
                .iter()
                .zip(&outcomes)
                .map(|(event, outcome)| {
                    let what = match outcome {
                        Outcome::Delivered => {
                            tally.delivered += 1;
                            "delivered".to_string()
                        }
                        Outcome::Retry(info) => {
                            tally.retry += 1;
                            match info.after_ms {
                                Some(ms) => format!("retry after {ms} ms: {}", info.reason),
                                None => format!("retry: {}", info.reason),
                            }
                        }
                        Outcome::Reject(reason) => {
                            tally.reject += 1;
                            format!("reject: {reason}")
                        }
                    };
                    format!("{} {}#{}: {what}", event.id, event.stream, event.sequence)
                })
                .collect(),
            Err(failure) => {
                tally.failed += chunk.len();
                chunk
                    .iter()
                    .map(|e| format!("{} {}#{}: failed: {failure}", e.id, e.stream, e.sequence))
                    .collect()
            }
        };
        for line in lines {
            let _ = writeln!(out, "{line}");
        }
    }
    let _ = writeln!(
        out,
        "{} events: {} delivered, {} to retry, {} rejected, {} in failed batches",
        batch.len(),
        tally.delivered,
        tally.retry,
        tally.reject,
        tally.failed
    );
    Ok(tally)
}

/// Read one CloudEvent per non-blank line, checked as ingest checks it,
/// as the sink will see it (attempt 1, ingested now).
fn read_events(file: &Path) -> Result<Vec<Event>, TrialError> {
    let text = std::fs::read_to_string(file).map_err(|source| TrialError::Read {
        file: file.to_path_buf(),
        source,
    })?;
    let now = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let mut next: BTreeMap<String, u64> = BTreeMap::new();
    let mut events = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fail = |problem: String| TrialError::Event {
            file: file.to_path_buf(),
            line: i + 1,
            problem,
        };
        let ev = crate::event::parse_one(line.as_bytes()).map_err(|e| fail(e.to_string()))?;
        let expected = next.get(&ev.stream).copied().unwrap_or(1);
        let sequence = match ev.sequence {
            Some(s) if s < expected => {
                return Err(fail(format!(
                    "sequence: {s} goes backwards in stream {:?} (next is at least {expected})",
                    ev.stream
                )))
            }
            Some(s) => s,
            None => expected,
        };
        next.insert(ev.stream.clone(), sequence + 1);
        events.push(Event {
            datacontenttype: ev.datacontenttype.clone().or_else(|| {
                (ev.data_format == crate::event::DataFormat::Json)
                    .then(|| "application/json".to_string())
            }),
            id: ev.id,
            source: ev.source,
            type_: ev.ty,
            subject: ev.subject,
            stream: ev.stream,
            sequence,
            time: ev.time.unwrap_or_else(|| now.clone()),
            dataschema: ev.dataschema,
            data: ev.data,
            extensions: ev.extensions.into_iter().collect(),
            attempt: 1,
            ingested_at: now.clone(),
        });
    }
    Ok(events)
}

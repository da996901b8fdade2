//! The console's read pages (every one a GET with its filters in the query
//! string): login, overview, events, an event, failed attempts, dead letters and the
//! dry run of a replay or purge, destinations, streams, plugins and
//! sources.
//!
//! Must never: change anything (the changes are `super::actions`'), or
//! read but through the admin actions.

use askama::Template;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use super::views::{self, DeliveryRow, DestinationRow, HeadRow};
use super::{admin_refusal, render, Authed, ConsoleState, Frame};
use crate::ops::actions::attempts::{self, AttemptQuery};
use crate::ops::actions::dead::{self, DeadSelection};
use crate::ops::actions::events::{self, EventBody, EventQuery, EventView, FoundEvent};
use crate::ops::actions::{destinations, parse_time, sinks, sources, streams, AdminError};
use crate::ops::actions::{DEAD_LIST_DEFAULT, DEAD_PAGE_MAX};
use crate::store::{DeadFilter, DeadLetter};

/// Query of the login page.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct LoginQuery {
    expired: Option<String>,
}

#[derive(Template)]
#[template(path = "login.html")]
pub(super) struct LoginPage {
    pub(super) frame: Frame,
    pub(super) no_token: bool,
}

/// `GET {prefix}/login`.
pub async fn login_form(
    State(state): State<ConsoleState>,
    Query(q): Query<LoginQuery>,
) -> Response {
    let mut frame = Frame::new(&state, None, "Log in");
    if q.expired.is_some() {
        frame.notice =
            Some("Log in with the admin token (your session ended or was never started).".into());
    }
    let no_token = state.ops.admin_token.as_deref().unwrap_or("").is_empty();
    render(StatusCode::OK, &LoginPage { frame, no_token })
}

struct SinkRow {
    name: String,
    state: String,
    /// Paused by an operator.
    paused: bool,
    version: String,
    notes: String,
}

fn sink_rows(s: &sinks::Sinks) -> Vec<SinkRow> {
    s.sinks
        .iter()
        .map(|v| {
            let mut notes = Vec::new();
            if v.paused {
                notes.push("paused".to_string());
            }
            if let Some(q) = &v.quarantine {
                notes.push(format!("quarantined until {}: {}", q.until, q.reason));
            }
            if let Some(r) = &v.refused {
                notes.push(format!("refused: {r}"));
            }
            if let Some(p) = &v.parked {
                notes.push(format!("parked: {p}"));
            }
            if v.unserved {
                notes.push("no replica serves it".into());
            }
            if v.version_skew {
                notes.push("version skew across replicas".into());
            }
            if v.retired {
                notes.push("retired".into());
            }
            SinkRow {
                name: v.sink.clone(),
                state: v.state.as_str().into(),
                paused: v.paused,
                version: v.version.clone().unwrap_or_else(|| "—".into()),
                notes: notes.join("; "),
            }
        })
        .collect()
}

struct SourceRow {
    name: String,
    kind: String,
    state: String,
    last_cycle: String,
    restarts: u64,
    error: String,
}

fn source_rows(s: &sources::Sources) -> Vec<SourceRow> {
    s.sources
        .iter()
        .map(|v| SourceRow {
            name: v.name.clone(),
            kind: v.kind.clone(),
            state: if v.ok { "ok" } else { "failing" }.into(),
            last_cycle: views::when_opt(v.last_cycle_at_ms.map(|m| m as i64)),
            restarts: v.restarts,
            error: v.last_error.clone().unwrap_or_default(),
        })
        .collect()
}

struct QueueRow {
    key: String,
    pending: u64,
    retrying: u64,
    leased: u64,
    dead: u64,
    oldest_due: String,
}

#[derive(Template)]
#[template(path = "overview.html")]
struct OverviewPage {
    frame: Frame,
    sinks: Vec<SinkRow>,
    replica: String,
    destinations: Vec<DestinationRow>,
    sources: Vec<SourceRow>,
    queue: Vec<QueueRow>,
    capped: bool,
    spark: Option<String>,
    rate_now: String,
}

/// `GET {prefix}/overview`.
pub async fn overview(State(state): State<ConsoleState>, authed: Authed) -> Response {
    let o = &state.ops;
    let read = async {
        let sinks = sinks::list_sinks(&*o.store, &o.plugins, &o.quarantines, &o.fleet).await?;
        let dests = destinations::list(&o.destinations()).await?;
        let queue = sinks::queue(&*o.store).await?;
        Ok::<_, AdminError>((sinks, dests, queue))
    };
    let (s, d, q) = match read.await {
        Ok(x) => x,
        Err(e) => return admin_refusal(&state, &authed, e),
    };
    let samples = state.rate.samples();
    let page = OverviewPage {
        frame: Frame::new(&state, Some(&authed), "Overview"),
        sinks: sink_rows(&s),
        replica: s.replica.clone(),
        destinations: d.destinations.iter().map(views::destination_row).collect(),
        sources: source_rows(&sources::list(&o.sources)),
        queue: q
            .sinks
            .iter()
            .map(|k| QueueRow {
                key: k.sink.clone(),
                pending: k.pending,
                retrying: k.retrying,
                leased: k.leased,
                dead: k.dead,
                oldest_due: views::age(k.oldest_due_age_ms),
            })
            .collect(),
        capped: q.capped,
        spark: super::rate::sparkline(&samples, 360, 48),
        rate_now: samples
            .last()
            .map_or_else(|| "—".into(), |r| format!("{r:.2}/s")),
    };
    render(StatusCode::OK, &page)
}

struct EventRow {
    id: String,
    stream: String,
    sequence: u64,
    ty: String,
    source: String,
    ingested: String,
    progress: String,
    class: String,
}

fn event_row(f: &FoundEvent) -> EventRow {
    let class = if f.dead > 0 {
        "bad"
    } else if f.open > 0 {
        "wait"
    } else {
        "ok"
    };
    EventRow {
        id: f.event.id.clone(),
        stream: f.event.stream.clone(),
        sequence: f.event.sequence,
        ty: f.event.ty.clone(),
        source: f.event.source.clone(),
        ingested: views::when(f.event.ingested_at_ms),
        progress: format!(
            "{} delivered, {} open, {} dead",
            f.delivered, f.open, f.dead
        ),
        class: class.into(),
    }
}

#[derive(Template)]
#[template(path = "events.html")]
struct EventsPage {
    frame: Frame,
    q: EventQuery,
    rows: Vec<EventRow>,
    limit: u32,
    searched: bool,
}

/// `GET {prefix}/events?id=&stream=&type=&source=&since=&until=&state=&limit=`.
pub async fn events(
    State(state): State<ConsoleState>,
    authed: Authed,
    Query(q): Query<EventQuery>,
) -> Response {
    let mut frame = Frame::new(&state, Some(&authed), "Events");
    let (rows, limit) = match events::search(&*state.ops.store, &q).await {
        Ok(found) => (found.events.iter().map(event_row).collect(), found.limit),
        Err(e) => {
            frame.error = Some(e.to_string());
            (Vec::new(), 0)
        }
    };
    let searched = [
        &q.id, &q.stream, &q.ty, &q.source, &q.since, &q.until, &q.state,
    ]
    .iter()
    .any(|f| f.as_deref().is_some_and(|t| !t.trim().is_empty()));
    let page = EventsPage {
        frame,
        q,
        rows,
        limit,
        searched,
    };
    render(StatusCode::OK, &page)
}

#[derive(Template)]
#[template(path = "event.html")]
struct EventPage {
    frame: Frame,
    ev: EventView,
    body: EventBody,
    ingested: String,
    producer: String,
    subject: String,
    time: String,
    content_type: String,
    deliveries: Vec<DeliveryRow>,
    /// The trace id of the event's `traceparent` (its creation context).
    trace_id: Option<String>,
    /// `console.trace-url` with the trace id in it.
    trace_link: Option<String>,
}

/// `GET {prefix}/events/{id}`: the event, its payload and its state per
/// destination ("delivered everywhere?").
pub async fn event(
    State(state): State<ConsoleState>,
    authed: Authed,
    Path(id): Path<String>,
) -> Response {
    let o = &state.ops;
    let read = async {
        let ev = events::show_event(&*o.store, &id).await?;
        let body = events::show_body(&*o.store, &id).await?;
        let dests = destinations::list(&o.destinations()).await?;
        Ok::<_, AdminError>((ev, body, dests))
    };
    let (ev, body, dests) = match read.await {
        Ok(x) => x,
        Err(e) => return admin_refusal(&state, &authed, e),
    };
    let mut deliveries: Vec<DeliveryRow> = ev.deliveries.iter().map(views::delivery_row).collect();
    for d in dests.destinations.iter().map(views::destination_row) {
        if !ev.deliveries.iter().any(|x| x.sink == d.name) {
            deliveries.push(views::not_routed(&d.name));
        }
    }
    let trace_id = body
        .extensions
        .get("traceparent")
        .and_then(|tp| crate::otel::context::parse_traceparent(tp))
        .map(|(trace, _, _)| trace.to_string());
    let trace_link = trace_id.as_ref().and_then(|trace| {
        let url = state.trace_url.as_deref()?;
        Some(url.replace("{trace_id}", trace))
    });
    let page = EventPage {
        trace_id,
        trace_link,
        frame: Frame::new(&state, Some(&authed), &format!("Event {id}")),
        ingested: views::when(ev.ingested_at_ms),
        producer: ev.producer.clone().unwrap_or_else(|| "—".into()),
        subject: ev.subject.clone().unwrap_or_else(|| "—".into()),
        time: ev.time.clone().unwrap_or_else(|| "—".into()),
        content_type: ev.datacontenttype.clone().unwrap_or_else(|| "—".into()),
        ev,
        body,
        deliveries,
    };
    render(StatusCode::OK, &page)
}

#[derive(Template)]
#[template(path = "attempts.html")]
struct AttemptsPage {
    frame: Frame,
    q: AttemptQuery,
    rows: Vec<views::AttemptRow>,
    limit: u32,
    kept: u32,
}

/// `GET {prefix}/attempts?sink=&event_id=&since=&until=&limit=`: failed
/// attempts, newest first — time, duration, outcome, the receiver's status
/// and the reason.
pub async fn attempts(
    State(state): State<ConsoleState>,
    authed: Authed,
    Query(q): Query<AttemptQuery>,
) -> Response {
    let mut frame = Frame::new(&state, Some(&authed), "Failed attempts");
    let (rows, limit) = match attempts::list(&*state.ops.store, &q).await {
        Ok(listed) => (views::attempt_rows(&listed), listed.limit),
        Err(e) => {
            frame.error = Some(e.to_string());
            (Vec::new(), 0)
        }
    };
    let page = AttemptsPage {
        frame,
        q,
        rows,
        limit,
        kept: crate::limits::ATTEMPTS_KEPT,
    };
    render(StatusCode::OK, &page)
}

/// The dead-letter filter as the pages' forms and links give it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct DeadQuery {
    /// Delivery key.
    pub sink: Option<String>,
    /// Stream.
    pub stream: Option<String>,
    /// Event id.
    pub event_id: Option<String>,
    /// Died at or after, RFC 3339.
    pub since: Option<String>,
    /// Died before, RFC 3339.
    pub until: Option<String>,
    /// `replay` or `purge` (the confirmation page only).
    pub action: Option<String>,
}

fn blank(o: &Option<String>) -> Option<String> {
    o.as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
}

impl DeadQuery {
    /// The admin layer's filter. Errors: a time that does not parse,
    /// naming `since` or `until`.
    pub fn filter(&self) -> Result<DeadFilter, AdminError> {
        let time =
            |field: &str, t: &Option<String>| blank(t).map(|t| parse_time(field, &t)).transpose();
        Ok(DeadFilter {
            sink: blank(&self.sink),
            stream: blank(&self.stream),
            event_id: blank(&self.event_id),
            since_ms: time("since", &self.since)?,
            until_ms: time("until", &self.until)?,
        })
    }

    /// The filter as a query string (`sink=…&stream=…`), for links.
    pub fn query_string(&self) -> String {
        let mut parts = Vec::new();
        for (k, val) in [
            ("sink", &self.sink),
            ("stream", &self.stream),
            ("event_id", &self.event_id),
            ("since", &self.since),
            ("until", &self.until),
        ] {
            if let Some(val) = blank(val) {
                parts.push(format!("{k}={}", encode(&val)));
            }
        }
        parts.join("&")
    }
}

/// `s` percent-encoded for a query string.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

struct DeadRow {
    event_id: String,
    key: String,
    stream: String,
    sequence: u64,
    attempts: u32,
    reason: String,
    died: String,
}

fn dead_row(d: &DeadLetter) -> DeadRow {
    DeadRow {
        event_id: d.event_id.clone(),
        key: d.sink.clone(),
        stream: d.stream.clone(),
        sequence: d.sequence,
        attempts: d.attempts,
        reason: d.reason.clone().unwrap_or_default(),
        died: views::when_opt(d.died_at_ms),
    }
}

#[derive(Template)]
#[template(path = "dead.html")]
struct DeadPage {
    frame: Frame,
    q: DeadQuery,
    qs: String,
    rows: Vec<DeadRow>,
    limit: u32,
}

/// `GET {prefix}/dead?sink=&stream=&event_id=&since=&until=`.
pub async fn dead(
    State(state): State<ConsoleState>,
    authed: Authed,
    Query(q): Query<DeadQuery>,
) -> Response {
    let mut frame = Frame::new(&state, Some(&authed), "Dead letters");
    let listed = match q.filter() {
        Ok(filter) => {
            let sel = DeadSelection {
                filter,
                limit: Some(DEAD_LIST_DEFAULT),
            };
            dead::list_dead(&*state.ops.store, &sel).await
        }
        Err(e) => Err(e),
    };
    let rows = match listed {
        Ok(l) => l.dead.iter().map(dead_row).collect(),
        Err(e) => {
            frame.error = Some(e.to_string());
            Vec::new()
        }
    };
    let page = DeadPage {
        frame,
        qs: q.query_string(),
        q,
        rows,
        limit: DEAD_LIST_DEFAULT,
    };
    render(StatusCode::OK, &page)
}

#[derive(Template)]
#[template(path = "dead_confirm.html")]
struct DeadConfirmPage {
    frame: Frame,
    q: DeadQuery,
    qs: String,
    action: String,
    count: usize,
    max: u32,
    streams: Vec<String>,
}

/// `GET {prefix}/dead/confirm?action=replay|purge&<filter>`: the dry run —
/// how many dead letters match (up to one run's [`DEAD_PAGE_MAX`]) and in
/// which streams — and the form that does it.
pub async fn dead_confirm(
    State(state): State<ConsoleState>,
    authed: Authed,
    Query(q): Query<DeadQuery>,
) -> Response {
    let action = match q.action.as_deref() {
        Some(a @ ("replay" | "purge")) => a.to_string(),
        other => {
            return admin_refusal(
                &state,
                &authed,
                crate::ops::actions::invalid(
                    "action",
                    format!("must be replay or purge, got {:?}", other.unwrap_or("")),
                ),
            )
        }
    };
    let listed = match q.filter() {
        Ok(filter) => {
            let sel = DeadSelection {
                filter,
                limit: Some(DEAD_PAGE_MAX),
            };
            dead::list_dead(&*state.ops.store, &sel).await
        }
        Err(e) => Err(e),
    };
    let letters = match listed {
        Ok(l) => l.dead,
        Err(e) => return admin_refusal(&state, &authed, e),
    };
    let mut streams: Vec<String> = letters.iter().map(|d| d.stream.clone()).collect();
    streams.sort();
    streams.dedup();
    let title = if action == "replay" {
        "Replay dead letters"
    } else {
        "Purge dead letters"
    };
    let page = DeadConfirmPage {
        frame: Frame::new(&state, Some(&authed), title),
        qs: q.query_string(),
        q,
        action,
        count: letters.len(),
        max: DEAD_PAGE_MAX,
        streams,
    };
    render(StatusCode::OK, &page)
}

#[derive(Template)]
#[template(path = "destinations.html")]
pub(super) struct DestinationsPage {
    pub(super) frame: Frame,
    pub(super) rows: Vec<DestinationRow>,
    pub(super) sinks: Vec<String>,
    /// A secret just made (create or rotate), shown this once.
    pub(super) secret: Option<(String, String)>,
}

/// The destinations page, with `frame` (carrying a notice or an error)
/// and a secret to show once.
pub(super) async fn destinations_page(
    state: &ConsoleState,
    mut frame: Frame,
    secret: Option<(String, String)>,
    status: StatusCode,
) -> Response {
    let rows = match destinations::list(&state.ops.destinations()).await {
        Ok(d) => d.destinations.iter().map(views::destination_row).collect(),
        Err(e) => {
            frame.error = Some(e.to_string());
            Vec::new()
        }
    };
    let page = DestinationsPage {
        frame,
        rows,
        sinks: state.ops.plugins.loaded(),
        secret,
    };
    render(status, &page)
}

/// `GET {prefix}/destinations`.
pub async fn destinations(State(state): State<ConsoleState>, authed: Authed) -> Response {
    let frame = Frame::new(&state, Some(&authed), "Destinations");
    destinations_page(&state, frame, None, StatusCode::OK).await
}

/// A destination's settings as the edit form shows them (credentials
/// and URL passwords masked, as every listing shows them).
pub(super) struct EditForm {
    pub(super) name: String,
    pub(super) sink: String,
    /// `key = value` lines.
    pub(super) config: String,
    pub(super) types: String,
    pub(super) streams: String,
    /// One condition a line.
    pub(super) conditions: String,
    pub(super) retry_base: String,
    pub(super) retry_cap: String,
    pub(super) retry_window: String,
    pub(super) rate: String,
    pub(super) in_flight: String,
}

#[derive(Template)]
#[template(path = "destination_edit.html")]
pub(super) struct EditPage {
    pub(super) frame: Frame,
    pub(super) form: Option<EditForm>,
}

/// The edit page of destination `name` with `frame` (carrying a notice or
/// an error); `form`, when given, is what was posted (shown again after a
/// refusal), else the stored settings.
pub(super) async fn edit_page(
    state: &ConsoleState,
    mut frame: Frame,
    name: &str,
    form: Option<EditForm>,
    status: StatusCode,
) -> Response {
    let form = match form {
        Some(f) => Some(f),
        None => match destinations::show(&state.ops.destinations(), name).await {
            Ok(destinations::Listed::Destination(l)) => Some(views::edit_form(&l.destination)),
            Ok(destinations::Listed::Unreadable(u)) => {
                frame.error = Some(format!(
                    "destination {name}'s record does not parse: {}",
                    u.error
                ));
                None
            }
            Err(e) => {
                frame.error = Some(e.to_string());
                return render(
                    StatusCode::from_u16(e.status()).unwrap_or(StatusCode::NOT_FOUND),
                    &EditPage { frame, form: None },
                );
            }
        },
    };
    render(status, &EditPage { frame, form })
}

/// `GET {prefix}/destinations/{name}/edit`: the form, filled with the
/// stored settings.
pub async fn destination_edit(
    State(state): State<ConsoleState>,
    authed: Authed,
    Path(name): Path<String>,
) -> Response {
    let frame = Frame::new(&state, Some(&authed), &format!("Edit destination {name}"));
    edit_page(&state, frame, &name, None, StatusCode::OK).await
}

/// Query of the streams page.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct StreamQuery {
    stream: Option<String>,
}

#[derive(Template)]
#[template(path = "streams.html")]
struct StreamsPage {
    frame: Frame,
    stream: String,
    rows: Vec<HeadRow>,
    looked: bool,
}

/// `GET {prefix}/streams?stream=`: the stream's head per destination and
/// why each does not move.
pub async fn streams(
    State(state): State<ConsoleState>,
    authed: Authed,
    Query(q): Query<StreamQuery>,
) -> Response {
    let mut frame = Frame::new(&state, Some(&authed), "Streams");
    let stream = blank(&q.stream).unwrap_or_default();
    let mut rows = Vec::new();
    if !stream.is_empty() {
        match streams::show(&state.ops.destinations(), &stream).await {
            Ok(view) => rows = view.heads.iter().map(views::head_row).collect(),
            Err(e) => frame.error = Some(e.to_string()),
        }
    }
    let page = StreamsPage {
        frame,
        looked: !stream.is_empty(),
        stream,
        rows,
    };
    render(StatusCode::OK, &page)
}

struct PluginRow {
    name: String,
    state: String,
    version: String,
    sha: String,
    replicas: String,
    notes: String,
}

#[derive(Template)]
#[template(path = "plugins.html")]
struct PluginsPage {
    frame: Frame,
    replica: String,
    plugins: Vec<PluginRow>,
    sources: Vec<SourceRow>,
}

/// `GET {prefix}/plugins`: loaded plugins across replicas, and sources.
pub async fn plugins(State(state): State<ConsoleState>, authed: Authed) -> Response {
    let o = &state.ops;
    let s = match sinks::list_sinks(&*o.store, &o.plugins, &o.quarantines, &o.fleet).await {
        Ok(s) => s,
        Err(e) => return admin_refusal(&state, &authed, e),
    };
    let notes = sink_rows(&s);
    let plugins = s
        .sinks
        .iter()
        .zip(notes)
        .map(|(v, row)| PluginRow {
            name: row.name,
            state: row.state,
            version: row.version,
            sha: v.wasm_sha256.clone().unwrap_or_else(|| "—".into()),
            replicas: v
                .replicas
                .iter()
                .map(|r| format!("{} ({})", r.replica, r.version))
                .collect::<Vec<_>>()
                .join(", "),
            notes: row.notes,
        })
        .collect();
    let page = PluginsPage {
        frame: Frame::new(&state, Some(&authed), "Plugins and sources"),
        replica: s.replica.clone(),
        plugins,
        sources: source_rows(&sources::list(&o.sources)),
    };
    render(StatusCode::OK, &page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_goes_into_a_link_encoded() {
        let q = DeadQuery {
            stream: Some("orders/42 a&b".into()),
            sink: Some(" ".into()),
            ..Default::default()
        };
        assert_eq!(q.query_string(), "stream=orders%2F42%20a%26b");
    }
}

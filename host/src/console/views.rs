//! What the pages show, in words: the admin actions' typed answers turned
//! into rows of text for the templates (times, states, reasons).
//!
//! Owns: the console's wording of a delivery's state and of why a head
//! does not move. Must never: reach the store or an action itself.

use crate::ops::actions::attempts::Attempts;
use crate::ops::actions::destinations::Listed;
use crate::ops::actions::streams::{HeadView, Why};
use crate::store::{AttemptOutcome, DeliveryInfo, DeliveryStatus};

/// `ms` (Unix ms) as RFC 3339 text.
pub fn when(ms: i64) -> String {
    crate::rfc3339::format_ms(ms)
}

/// `ms` (Unix ms) or a dash.
pub fn when_opt(ms: Option<i64>) -> String {
    ms.map_or_else(|| "—".to_string(), when)
}

/// A duration in ms, short (`950 ms`, `12.5 s`, `3.2 min`, `1.5 h`).
pub fn age(ms: Option<i64>) -> String {
    let Some(ms) = ms else {
        return "—".into();
    };
    let s = ms as f64 / 1000.0;
    if ms < 1000 {
        format!("{ms} ms")
    } else if s < 120.0 {
        format!("{s:.1} s")
    } else if s < 7200.0 {
        format!("{:.1} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

/// One delivery key's state for one event, as the event page shows it.
pub struct DeliveryRow {
    /// The delivery key (destination or sink).
    pub key: String,
    /// `delivered`, `pending`, `in flight`, `failing`, `dead`, `not routed`.
    pub state: String,
    /// CSS class of the state.
    pub class: String,
    /// When, why, attempts.
    pub detail: String,
    /// It has a delivery (whose failed attempts the row links to).
    pub routed: bool,
}

/// `d` in words.
pub fn delivery_row(d: &DeliveryInfo) -> DeliveryRow {
    let attempts = format!(
        "{} attempt{}",
        d.attempts,
        if d.attempts == 1 { "" } else { "s" }
    );
    let reason = d.last_error.clone().unwrap_or_default();
    let (state, class, detail) = match d.status {
        DeliveryStatus::Delivered => (
            "delivered",
            "ok",
            format!("at {}; {attempts}", when_opt(d.finished_at_ms)),
        ),
        DeliveryStatus::Pending => (
            "pending",
            "wait",
            format!("due at {}", when_opt(d.next_attempt_at_ms)),
        ),
        DeliveryStatus::Leased => ("in flight", "wait", format!("being delivered; {attempts}")),
        DeliveryStatus::Retrying => (
            "failing",
            "bad",
            format!(
                "next attempt at {}; {attempts}; last reason: {reason}",
                when_opt(d.next_attempt_at_ms)
            ),
        ),
        DeliveryStatus::Dead => (
            "dead",
            "bad",
            format!(
                "since {}; {attempts}; reason: {reason}",
                when_opt(d.finished_at_ms)
            ),
        ),
    };
    DeliveryRow {
        key: d.sink.clone(),
        state: state.into(),
        class: class.into(),
        detail,
        routed: true,
    }
}

/// A destination with no delivery of the event: its filter did not take
/// it, or it did not exist yet when the event was routed.
pub fn not_routed(key: &str) -> DeliveryRow {
    DeliveryRow {
        key: key.to_string(),
        state: "filtered out".into(),
        class: "muted".into(),
        detail: "no delivery: its filter or the routes did not take this event (or it was created later)"
            .into(),
        routed: false,
    }
}

/// One failed attempt in words, as the attempts page lists it.
pub struct AttemptRow {
    /// When it was recorded, RFC 3339.
    pub time: String,
    /// The event.
    pub event_id: String,
    /// The delivery key (destination or sink).
    pub key: String,
    /// The event's stream.
    pub stream: String,
    /// Its sequence.
    pub sequence: u64,
    /// The delivery's attempt number.
    pub attempt: u32,
    /// The plugin call's duration (`230 ms`), or a dash.
    pub duration: String,
    /// `retry`, `dead`, `trap` or `timeout`.
    pub outcome: String,
    /// CSS class of the outcome: `bad` for a dead letter, `wait` otherwise.
    pub class: String,
    /// The receiver's HTTP status or broker answer, or a dash.
    pub status: String,
    /// Why it failed.
    pub reason: String,
}

/// The rows of a listing, in its order.
pub fn attempt_rows(listed: &Attempts) -> Vec<AttemptRow> {
    listed
        .attempts
        .iter()
        .map(|a| AttemptRow {
            time: when(a.attempted_at_ms),
            event_id: a.event_id.clone(),
            key: a.sink.clone(),
            stream: a.stream.clone(),
            sequence: a.sequence,
            attempt: a.attempt,
            duration: age(a.duration_ms),
            outcome: a.outcome.as_str().to_string(),
            class: if a.outcome == AttemptOutcome::Dead {
                "bad"
            } else {
                "wait"
            }
            .into(),
            status: a.status.clone().unwrap_or_else(|| "—".into()),
            reason: a.reason.clone(),
        })
        .collect()
}

/// One destination as the destinations page and the overview list it.
pub struct DestinationRow {
    /// Its name (delivery key).
    pub name: String,
    /// Its sink (plugin).
    pub sink: String,
    /// `active`, `paused`, `disabled`, or `unreadable`.
    pub state: String,
    /// Why it is paused or disabled; why unreadable.
    pub reason: String,
    /// Paused or disabled: the form offers resume.
    pub held: bool,
    /// Queue figures.
    pub pending: u64,
    /// Waiting to retry.
    pub retrying: u64,
    /// Being delivered.
    pub leased: u64,
    /// Dead letters.
    pub dead: u64,
    /// How long its oldest due head has waited.
    pub oldest_due: String,
    /// Health in words: `delivering`, `failing since T: reason`, `no attempt yet`.
    pub health: String,
    /// A signing secret is set.
    pub has_secret: bool,
    /// The last hour per minute as an inline SVG (delivered and failed
    /// events), empty before any batch in that hour.
    pub last_hour: String,
    /// Events delivered and failed in the last hour.
    pub hour_delivered: u64,
    /// Events failed in the last hour.
    pub hour_failed: u64,
}

/// `l` in words.
pub fn destination_row(l: &Listed) -> DestinationRow {
    match l {
        Listed::Destination(l) => {
            let d = &l.destination;
            let state = serde_json::to_value(d.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            let health = match &l.health {
                None => "no attempt yet".to_string(),
                Some(h) => match h.failing_since_ms {
                    Some(since) => format!(
                        "failing since {}: {}",
                        when(since),
                        h.last_error.clone().unwrap_or_default()
                    ),
                    None if h.last_success_at_ms.is_some() => format!(
                        "delivering (last success {})",
                        when_opt(h.last_success_at_ms)
                    ),
                    None => "no attempt yet".to_string(),
                },
            };
            let (delivered, failed) = l
                .health
                .as_ref()
                .map(|h| h.last_hour(crate::destinations::now_ms()))
                .unwrap_or_default();
            let last_hour = if delivered.iter().chain(&failed).any(|v| *v > 0.0) {
                super::rate::sparkline_pair(&delivered, &failed, 120, 24).unwrap_or_default()
            } else {
                String::new()
            };
            DestinationRow {
                name: d.name.clone(),
                sink: d.sink.clone(),
                held: state != "active",
                last_hour,
                hour_delivered: delivered.iter().sum::<f64>() as u64,
                hour_failed: failed.iter().sum::<f64>() as u64,
                state,
                reason: d.state_reason.clone().unwrap_or_default(),
                pending: l.queue.pending,
                retrying: l.queue.retrying,
                leased: l.queue.leased,
                dead: l.queue.dead,
                oldest_due: age(l.queue.oldest_due_age_ms),
                health,
                has_secret: d.has_secret,
            }
        }
        Listed::Unreadable(u) => DestinationRow {
            name: u.name.clone(),
            sink: u.sink.clone(),
            state: "unreadable".into(),
            reason: u.error.clone(),
            held: false,
            pending: 0,
            retrying: 0,
            leased: 0,
            dead: 0,
            oldest_due: "—".into(),
            health: "—".into(),
            has_secret: false,
            last_hour: String::new(),
            hour_delivered: 0,
            hour_failed: 0,
        },
    }
}

/// One head of a stream in words.
pub struct HeadRow {
    /// The delivery key.
    pub key: String,
    /// The plugin serving it.
    pub plugin: String,
    /// The head's event.
    pub event_id: String,
    /// Its sequence.
    pub sequence: u64,
    /// Its delivery state.
    pub status: String,
    /// Attempts so far.
    pub attempts: u32,
    /// Why it does not move, in words.
    pub why: String,
    /// CSS class: `ok` when due, `bad` otherwise.
    pub class: String,
}

/// `h` in words.
pub fn head_row(h: &HeadView) -> HeadRow {
    let why = match &h.why {
        Why::SinkPaused { sink } => format!("paused: sink {sink} is paused by an operator"),
        Why::DestinationHeld { state, reason } => format!(
            "destination {state}{}",
            reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ),
        Why::BlockedByDead { event_id, reason } => format!(
            "blocked by dead letter {event_id}{} — replay or purge it",
            reason
                .as_deref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ),
        Why::InFlight { until_ms } => format!("in flight, lease until {}", when_opt(*until_ms)),
        Why::WaitingForRetry {
            until_ms,
            last_error,
        } => format!(
            "waiting for retry until {}{}",
            when(*until_ms),
            last_error
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        ),
        Why::ChainedBehind { sink, status } => {
            format!("chained behind sink {sink}, whose delivery of this event is {status}")
        }
        Why::HeldByLock { holder: None } => {
            "held by a lock: another database session holds its row, so claims skip it".to_string()
        }
        Why::HeldByLock { holder: Some(l) } => format!(
            "held by a lock: database session {} ({}{}, {}) holds its row since {}, so claims skip it; \
             it moves when that transaction ends",
            l.pid.map_or_else(|| "?".to_string(), |p| p.to_string()),
            l.application.as_deref().filter(|a| !a.is_empty()).unwrap_or("no application name"),
            l.client.as_deref().map(|c| format!(" from {c}")).unwrap_or_default(),
            l.state.as_deref().unwrap_or("state unknown"),
            when_opt(l.since_ms),
        ),
        Why::Due => "due: the next claim takes it".to_string(),
    };
    HeadRow {
        key: h.head.sink.clone(),
        plugin: h.plugin.clone(),
        event_id: h.head.event_id.clone(),
        sequence: h.head.sequence,
        status: h.head.status.to_string(),
        attempts: h.head.attempts,
        class: if h.why == Why::Due { "ok" } else { "bad" }.into(),
        why,
    }
}

/// `d`'s settings as the edit form shows them: config as `key = value`
/// lines, globs comma-separated, conditions a line each, durations as
/// `humantime` writes them (`2s`, `10m`), an unset field empty.
pub fn edit_form(d: &crate::destinations::DestinationView) -> super::pages::EditForm {
    let duration = |v: Option<std::time::Duration>| {
        v.map(|v| humantime::format_duration(v).to_string())
            .unwrap_or_default()
    };
    let retry = d.retry.clone().unwrap_or_default();
    super::pages::EditForm {
        name: d.name.clone(),
        sink: d.sink.clone(),
        config: d
            .config
            .iter()
            .map(|(k, v)| format!("{k} = {v}"))
            .collect::<Vec<_>>()
            .join("\n"),
        types: d.filter.types.join(", "),
        streams: d.filter.streams.join(", "),
        conditions: d.filter.conditions.join("\n"),
        retry_base: duration(retry.base),
        retry_cap: duration(retry.cap),
        retry_window: duration(retry.window),
        rate: d.rate_per_second.map(|r| r.to_string()).unwrap_or_default(),
        in_flight: d.max_in_flight.map(|r| r.to_string()).unwrap_or_default(),
    }
}

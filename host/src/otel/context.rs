//! The W3C Trace Context (https://www.w3.org/TR/trace-context/) as
//! outboxd carries it: read from a header or an attribute, checked, and
//! written back unchanged.
//!
//! Owns: the `traceparent` syntax (§3.2: `00-<32 hex>-<16 hex>-<2 hex>`,
//! neither id all zeros), the names of the CloudEvents distributed-tracing
//! extension (`traceparent`, `tracestate`), and [`adopt`], the rule by
//! which an event takes a transport's context.
//!
//! Must never: change a context an event already carries (it is the
//! event's creation context, CloudEvents distributed-tracing extension),
//! or fail a request over a malformed trace header (§3.2.2.1: a receiver
//! ignores a `traceparent` it cannot parse).

use std::collections::BTreeMap;

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

/// CloudEvents extension and HTTP header carrying the parent of a trace.
pub const TRACEPARENT: &str = "traceparent";
/// CloudEvents extension and HTTP header carrying vendor trace state.
pub const TRACESTATE: &str = "tracestate";
/// Longest `tracestate` kept, in bytes (W3C §3.3.1.1: 32 members of at
/// most 256 characters, 512 bytes recommended as a propagation floor).
pub const MAX_TRACESTATE_BYTES: usize = 8192;

/// A trace context as text: what travels in headers and extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// `traceparent`, checked by [`parse_traceparent`].
    pub traceparent: String,
    /// `tracestate`, when one came with it.
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// The context from a `traceparent` and an optional `tracestate`;
    /// `None` when `traceparent` is absent or malformed.
    pub fn from_parts(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<TraceContext> {
        let traceparent = traceparent?.trim();
        parse_traceparent(traceparent)?;
        Some(TraceContext {
            traceparent: traceparent.to_string(),
            tracestate: tracestate
                .map(str::trim)
                .filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE_BYTES)
                .map(str::to_string),
        })
    }

    /// The context carried by an event's extensions, if a valid one.
    pub fn of_extensions(extensions: &BTreeMap<String, String>) -> Option<TraceContext> {
        TraceContext::from_parts(
            extensions.get(TRACEPARENT).map(String::as_str),
            extensions.get(TRACESTATE).map(String::as_str),
        )
    }

    /// As an OpenTelemetry remote span context.
    pub fn span_context(&self) -> Option<SpanContext> {
        let (trace_id, span_id, flags) = parse_traceparent(&self.traceparent)?;
        let state = self
            .tracestate
            .as_deref()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        Some(SpanContext::new(trace_id, span_id, flags, true, state))
    }

    /// The context of `span` as text.
    pub fn of_span(span: &SpanContext) -> TraceContext {
        let state = span.trace_state().header();
        TraceContext {
            traceparent: format_traceparent(span),
            tracestate: (!state.is_empty()).then_some(state),
        }
    }
}

/// Parse a version-00 `traceparent` (W3C §3.2): its trace id, parent id
/// and flags. `None` for anything else, all-zero ids included. A higher
/// version is read by its version-00 prefix, as §3.2.4 asks.
pub fn parse_traceparent(value: &str) -> Option<(TraceId, SpanId, TraceFlags)> {
    let mut parts = value.split('-');
    let version = parts.next()?;
    let trace_id = parts.next()?;
    let span_id = parts.next()?;
    let flags = parts.next()?;
    let lower_hex = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if version.len() != 2 || !lower_hex(version) || version == "ff" {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    if trace_id.len() != 32 || span_id.len() != 16 || flags.len() != 2 {
        return None;
    }
    if !lower_hex(trace_id) || !lower_hex(span_id) || !lower_hex(flags) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some((trace_id, span_id, TraceFlags::new(flags & 1)))
}

/// `span` as a version-00 `traceparent`.
pub fn format_traceparent(span: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        span.trace_id(),
        span.span_id(),
        span.trace_flags().to_u8()
    )
}

/// Give an event the transport's context (the request's `traceparent`
/// and `tracestate` headers, a message's headers, an outbox property)
/// when it carries none of its own. An event's own `traceparent`
/// extension wins, valid or not: it is what the producer said.
pub fn adopt(extensions: &mut BTreeMap<String, String>, transport: Option<&TraceContext>) {
    if extensions.contains_key(TRACEPARENT) {
        return;
    }
    let Some(context) = transport else {
        return;
    };
    extensions.insert(TRACEPARENT.to_string(), context.traceparent.clone());
    match &context.tracestate {
        Some(state) => {
            extensions.insert(TRACESTATE.to_string(), state.clone());
        }
        None => {
            extensions.remove(TRACESTATE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_the_spec_example_and_refuses_the_rest() {
        let (trace, span, flags) = parse_traceparent(TP).unwrap();
        assert_eq!(trace.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(span.to_string(), "00f067aa0ba902b7");
        assert!(flags.is_sampled());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad}");
        }
        // A later version is read by its version-00 prefix.
        assert!(parse_traceparent(&format!("cc{}-extra", &TP[2..])).is_some());
    }

    #[test]
    fn round_trips_through_a_span_context() {
        let ctx = TraceContext::from_parts(Some(TP), Some("congo=t61rcWkgMzE")).unwrap();
        let span = ctx.span_context().unwrap();
        assert_eq!(TraceContext::of_span(&span), ctx);
    }

    #[test]
    fn an_event_keeps_its_own_context() {
        let transport = TraceContext::from_parts(Some(TP), None);
        let mut own = BTreeMap::from([(TRACEPARENT.to_string(), "mine".to_string())]);
        adopt(&mut own, transport.as_ref());
        assert_eq!(own[TRACEPARENT], "mine");
        let mut none = BTreeMap::new();
        adopt(&mut none, transport.as_ref());
        assert_eq!(none[TRACEPARENT], TP);
        assert!(!none.contains_key(TRACESTATE));
    }
}

//! The trace context of the current attempt (the WIT `trace` interface,
//! `outboxd:sink@0.1.1`), to carry a trace on to the target. The batch's
//! contexts are asked for once, together (`traceparents`, since 0.1.5),
//! the first time one is wanted, and kept for the instance's one batch.
//!
//! The host makes a span for each attempt, under the event's creation
//! context, and one under it for every outbound HTTP request that carries
//! the attempt's `traceparent`; so a sink that sends [`traceparent`] as a
//! header hands the receiver the producer's trace. With tracing off the
//! host answers the event's creation context, so the trace still reaches
//! the receiver.
//!
//! Must never: make up a context, or change the event's `traceparent`
//! extension (that is its creation context, CloudEvents distributed
//! tracing; the webhook sink sends it as `ce-traceparent`).

use crate::Event;

#[cfg(target_arch = "wasm32")]
std::thread_local! {
    /// The batch's contexts by event id, once asked for. An instance
    /// delivers one batch, so they are never another batch's.
    static CONTEXTS: std::cell::OnceCell<std::collections::HashMap<String, String>> =
        const { std::cell::OnceCell::new() };
}

/// The W3C `traceparent` of the attempt delivering `event`, if any.
/// (Outside a component, in a sink's native unit tests: none.)
pub fn traceparent(event: &Event) -> Option<String> {
    #[cfg(target_arch = "wasm32")]
    {
        CONTEXTS.with(|contexts| {
            contexts
                .get_or_init(|| {
                    crate::bindings::outboxd::sink::trace::traceparents()
                        .into_iter()
                        .collect()
                })
                .get(&event.id)
                .cloned()
        })
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        let _ = event;
        None
    }
}

/// Add `traceparent` (the HTTP header of W3C Trace Context, the AMQP
/// application property of its AMQP format) for `event` to `headers`,
/// unless there is no context; `value` makes the header's value type.
pub fn add_header<V>(headers: &mut Vec<(String, V)>, event: &Event, value: impl Fn(String) -> V) {
    if let Some(context) = traceparent(event) {
        headers.retain(|(name, _)| !name.eq_ignore_ascii_case("traceparent"));
        headers.push(("traceparent".to_string(), value(context)));
    }
}

//! Delivering a batch over HTTP: different streams concurrently, each stream
//! strictly in batch order.
//!
//! Every stream has a queue of its events. A stream is either *ready* (its
//! next event may start), *in flight* (one request outstanding) or done. Up
//! to `max-concurrency` requests are in flight, each of a different stream,
//! handed to the host's `http-batch` interface together (`start`); the loop
//! takes whichever answers are ready (`wait`), settles them, and starts the
//! next event of each stream that may go on, so a receiver holding one
//! request holds only its own stream. When an event is not delivered, the
//! rest of its stream in this batch is not sent and answers `retry`
//! ("predecessor <id> not delivered"), so a receiver never sees an event
//! before its predecessor.
//!
//! The sink says how an event's request is built (`start`) and what a
//! response means (`judge`); this module owns only the scheduling.
//!
//! Must never: start an event while an earlier event of its stream in the
//! batch is undelivered, or have more than `max_in_flight` requests out.

use std::collections::{HashMap, VecDeque};

use crate::batch::{self, BatchRequest};
use crate::http::Response;
use crate::outcome;
use crate::RetryInfo;
use crate::{Event, Outcome};

/// Requests handed to the host together while more are being built. The
/// host hands each group to its connections as it is started, so the
/// first requests of a batch are on the wire while the rest are built,
/// not after all of them (bench/results/2026-12-05-start-groups.md:
/// +8% requests/s for the `webhook` and `awareness` sinks; groups of 2
/// to 8 alike).
const START_GROUP: usize = 4;

/// Sends every event of `batch`, up to `max_in_flight` requests at once
/// (at least 1, at most [`batch::MAX_PER_CALL`]); `outcomes[i]` answers
/// `batch[i]`. `start` builds an event's request ([`batch::post`]), or
/// decides its outcome without sending (`Err`); `judge` turns its response
/// into the outcome. A request that got no response is
/// [`batch::for_error`].
pub fn deliver<'a>(
    batch: &'a [Event],
    max_in_flight: usize,
    mut start: impl FnMut(&'a Event) -> Result<BatchRequest, Outcome>,
    mut judge: impl FnMut(&'a Event, Response) -> Outcome,
) -> Vec<Outcome> {
    let max_in_flight = max_in_flight.clamp(1, batch::MAX_PER_CALL);
    let mut state = Batch::new(batch);
    // The stream of each event in flight, by event index (the request's
    // tag), and how many are.
    let mut in_flight: Vec<Option<usize>> = vec![None; batch.len()];
    let mut out = 0;
    loop {
        let mut starting: Vec<(u64, BatchRequest)> = Vec::new();
        while out < max_in_flight {
            let Some((stream, event)) = state.next_ready() else {
                break;
            };
            match start(&batch[event]) {
                Ok(request) => {
                    in_flight[event] = Some(stream);
                    out += 1;
                    starting.push((event as u64, request));
                    if starting.len() == START_GROUP {
                        batch::start(&starting);
                        starting.clear();
                    }
                }
                Err(decided) => state.settle(stream, event, decided),
            }
        }
        batch::start(&starting);
        if out == 0 {
            break;
        }
        let answers = batch::wait();
        if answers.is_empty() {
            // The host has nothing in flight although requests were
            // started: those are answered `retry` below.
            break;
        }
        for (tag, answer) in answers {
            let Some(stream) = usize::try_from(tag)
                .ok()
                .and_then(|event| in_flight.get_mut(event))
                .and_then(Option::take)
            else {
                continue;
            };
            out -= 1;
            let event = tag as usize;
            let outcome = match answer {
                Ok(response) => judge(&batch[event], response),
                Err(error) => batch::for_error(&error),
            };
            state.settle(stream, event, outcome);
        }
    }
    state.into_outcomes()
}

/// The batch's bookkeeping: answers so far, the streams' queues, and which
/// streams may start their next event.
struct Batch<'a> {
    events: &'a [Event],
    outcomes: Vec<Option<Outcome>>,
    /// Per stream, in order of first appearance: indices into `events` not
    /// yet started, in batch order.
    queues: Vec<VecDeque<usize>>,
    /// Streams whose next event may start, first come first served.
    ready: VecDeque<usize>,
}

impl<'a> Batch<'a> {
    fn new(events: &'a [Event]) -> Batch<'a> {
        let mut queues: Vec<VecDeque<usize>> = Vec::new();
        let mut by_name: HashMap<&str, usize> = HashMap::new();
        for (index, event) in events.iter().enumerate() {
            let stream = *by_name.entry(event.stream.as_str()).or_insert_with(|| {
                queues.push(VecDeque::new());
                queues.len() - 1
            });
            if let Some(queue) = queues.get_mut(stream) {
                queue.push_back(index);
            }
        }
        Batch {
            events,
            outcomes: vec![None; events.len()],
            ready: (0..queues.len()).collect(),
            queues,
        }
    }

    /// The next event to start, with its stream.
    fn next_ready(&mut self) -> Option<(usize, usize)> {
        while let Some(stream) = self.ready.pop_front() {
            if let Some(event) = self.queues.get_mut(stream).and_then(VecDeque::pop_front) {
                return Some((stream, event));
            }
        }
        None
    }

    /// Records the answer for `events[event]`. Delivered: its stream's next
    /// event may start. Anything else: the stream's remaining events retry.
    fn settle(&mut self, stream: usize, event: usize, outcome: Outcome) {
        let Some(queue) = self.queues.get_mut(stream) else {
            return;
        };
        match &outcome {
            Outcome::Delivered => {
                if !queue.is_empty() {
                    self.ready.push_back(stream);
                }
            }
            Outcome::Retry(_) | Outcome::Reject(_) => {
                // A successor cannot go before its predecessor, so it waits
                // at least as long as the target asked the predecessor to.
                let after_ms = match &outcome {
                    Outcome::Retry(info) => info.after_ms,
                    _ => None,
                };
                let id = self.events.get(event).map_or("?", |e| e.id.as_str());
                let reason = format!("predecessor {id} not delivered");
                for later in queue.drain(..) {
                    if let Some(slot) = self.outcomes.get_mut(later) {
                        *slot = Some(Outcome::Retry(RetryInfo {
                            reason: reason.clone(),
                            after_ms,
                        }));
                    }
                }
            }
        }
        if let Some(slot) = self.outcomes.get_mut(event) {
            *slot = Some(outcome);
        }
    }

    fn into_outcomes(self) -> Vec<Outcome> {
        self.outcomes
            .into_iter()
            .map(|outcome| outcome.unwrap_or_else(|| outcome::retry("not attempted")))
            .collect()
    }
}

//! Delivering a batch over HTTP: different streams concurrently, each stream
//! strictly in batch order.
//!
//! Every stream has a queue of its events. The batch goes in rounds: each
//! round takes the next event of up to `max-concurrency` streams that may
//! go on, hands their requests to the host in one `http-batch` call (one
//! request per stream, so the host's lack of order within a call cannot
//! reorder a stream), and settles every answer before the next round. When
//! an event is not delivered, the rest of its stream in this batch is not
//! sent and answers `retry` ("predecessor <id> not delivered"), so a
//! receiver never sees an event before its predecessor.
//!
//! The sink says how an event's request is built (`start`) and what a
//! response means (`judge`); this module owns only the scheduling.
//!
//! Must never: start an event while an earlier event of its stream in the
//! batch is undelivered, put two events of one stream in one call, or have
//! more than `max_in_flight` requests out.

use std::collections::{BTreeMap, VecDeque};

use crate::batch::{self, BatchRequest};
use crate::http::Response;
use crate::outcome;
use crate::RetryInfo;
use crate::{Event, Outcome};

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
    loop {
        let mut round: Vec<(usize, usize)> = Vec::new();
        let mut requests: Vec<BatchRequest> = Vec::new();
        while round.len() < max_in_flight {
            let Some((stream, event)) = state.next_ready() else {
                break;
            };
            match start(&batch[event]) {
                Ok(request) => {
                    round.push((stream, event));
                    requests.push(request);
                }
                Err(decided) => state.settle(stream, event, decided),
            }
        }
        if round.is_empty() {
            break;
        }
        let mut answers = batch::send_all(&requests).into_iter();
        for (stream, event) in round {
            let outcome = match answers.next() {
                Some(Ok(response)) => judge(&batch[event], response),
                Some(Err(error)) => batch::for_error(&error),
                None => outcome::retry("the host gave no answer for this request"),
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
        let mut by_name: BTreeMap<&str, usize> = BTreeMap::new();
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

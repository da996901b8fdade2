//! One POST through `wasi:http/outgoing-handler`, driven without blocking so
//! that many can be in flight at once: the caller waits on
//! [`Request::pollable`] together with the other requests' pollables
//! (`wasi:io/poll.poll`) and calls [`Request::advance`] once it is ready.
//! [`crate::streams`] does that for a whole batch.
//!
//! A request goes through four phases: writing the body, waiting for the
//! body's flush, waiting for the response, reading (a bounded part of) the
//! response body. It ends in an [`Answer`]: the response (status, headers,
//! the start of a non-2xx body) for the sink to judge, or the outcome of a
//! request that got no response. Two rules hold throughout:
//!
//! - Host resources are dropped children first (pollable, then stream, then
//!   body, then response): the host refuses to drop a resource whose children
//!   are alive, and that refusal is a trap. Each phase declares its fields in
//!   that order, so Rust's drop order keeps the rule.
//! - A failed body write is never the answer. When the host refuses a
//!   request (its allow-list, say), the body's stream closes before the
//!   response future reports why; the body is finished anyway and the
//!   future's error becomes the reason.
//!
//! Must never: read more than [`RESPONSE_BODY_CAP`] of a response body, or
//! decide what a status code means (the sink's table does).

use std::borrow::Cow;
use std::time::Duration;

use wasip2::clocks::wall_clock;
use wasip2::http::outgoing_handler;
use wasip2::http::types::Fields;
use wasip2::http::types::{
    FutureIncomingResponse, HeaderError, IncomingBody, IncomingResponse, Method, OutgoingBody,
    OutgoingRequest, RequestOptions, Scheme,
};
use wasip2::io::poll::Pollable;
use wasip2::io::streams::{InputStream, OutputStream};

use crate::http::{Response, Url};
use crate::outcome;
use crate::Outcome;

/// A request header as `wasi:http/types.fields.from-list` takes it.
pub type Header = (String, Vec<u8>);

/// Most bytes of a response body read (and then discarded); the rest is left
/// unread. Enough to drain a typical acknowledgement so the connection can be
/// reused, small enough that a chatty endpoint costs nothing.
pub const RESPONSE_BODY_CAP: usize = 64 * 1024;

/// Upper bound for requests in flight at once: each holds about five host
/// resources, and the host caps the resource table.
pub const MAX_IN_FLIGHT: u64 = 1024;

/// Upper bound for a request's timeout, in milliseconds: 10 minutes, what
/// WASI applies when none is set.
pub const MAX_TIMEOUT_MS: u64 = 600_000;

/// Bytes asked for per read of the response body.
const READ_CHUNK: usize = 16 * 1024;

/// Where and how to POST.
#[derive(Debug, Clone, Copy)]
pub struct Post<'r> {
    pub url: &'r Url,
    /// Header names and values, in order.
    pub headers: &'r [Header],
    /// Connect, first-byte and between-bytes timeout; the host may clamp it
    /// to its own ceilings.
    pub timeout: Duration,
}

/// An HTTP request in flight.
pub struct Request<'a> {
    /// The request body, written as the host accepts it: borrowed from the
    /// event (its data as is) or built for the request.
    body: Cow<'a, [u8]>,
    phase: Phase,
}

/// What [`Request::advance`] came to.
pub enum Progress<'a> {
    /// Still in flight: poll [`Request::pollable`] again.
    Pending(Request<'a>),
    /// Finished.
    Done(Answer),
}

/// How a request ended.
#[derive(Debug, Clone)]
pub enum Answer {
    /// A response came: its status and, when the status is not 2xx, its
    /// headers (names lower-case) and the first
    /// [`outcome::REASON_BODY_BYTES`] of its body (for `Retry-After` and a
    /// reject reason).
    Response(Response),
    /// No response to judge: the outcome is already decided (a transport
    /// error is `retry` naming it; a request that can never be sent as
    /// built, such as a header the host forbids, is `reject`; a sink may
    /// also decide an event without sending it).
    Decided(Outcome),
}

enum Phase {
    /// Handing the body to the host.
    Writing(Writing),
    /// All of the body handed over; waiting for the flush to complete.
    Flushing(Writing),
    /// Body finished; waiting for the response head.
    Awaiting(Awaiting),
    /// Reading up to [`RESPONSE_BODY_CAP`] of the response body.
    Reading(Reading),
}

// Field order is drop order: children before parents.

struct Writing {
    ready: Pollable,
    stream: OutputStream,
    body: OutgoingBody,
    written: usize,
    response: FutureIncomingResponse,
}

struct Awaiting {
    ready: Pollable,
    response: FutureIncomingResponse,
}

struct Reading {
    ready: Pollable,
    stream: InputStream,
    body: IncomingBody,
    status: u16,
    headers: Vec<Header>,
    read: usize,
    /// The start of a non-2xx body, for a reject reason.
    kept: Vec<u8>,
}

/// What one phase step came to.
enum Step {
    /// Blocked: wait on the phase's pollable.
    Wait(Phase),
    /// Moved on: step the next phase at once.
    Next(Phase),
    Done(Answer),
}

impl<'a> Request<'a> {
    /// Sends `POST` with `body` as `post` says and makes as much progress
    /// as possible without blocking.
    pub fn start(post: Post<'_>, body: Cow<'a, [u8]>) -> Progress<'a> {
        match begin(post, body.len()) {
            Ok(phase) => Request { body, phase }.advance(),
            Err(outcome) => Progress::Done(Answer::Decided(outcome)),
        }
    }

    /// What to wait on before calling [`Request::advance`] again.
    pub fn pollable(&self) -> &Pollable {
        match &self.phase {
            Phase::Writing(w) | Phase::Flushing(w) => &w.ready,
            Phase::Awaiting(a) => &a.ready,
            Phase::Reading(r) => &r.ready,
        }
    }

    /// Moves the request on as far as it goes without blocking.
    pub fn advance(self) -> Progress<'a> {
        let Request { body, mut phase } = self;
        loop {
            let step = match phase {
                Phase::Writing(w) => write(w, &body),
                Phase::Flushing(w) => flush(w),
                Phase::Awaiting(a) => await_response(a),
                Phase::Reading(r) => read(r),
            };
            match step {
                Step::Wait(waiting) => {
                    return Progress::Pending(Request {
                        body,
                        phase: waiting,
                    })
                }
                Step::Next(next) => phase = next,
                Step::Done(answer) => return Progress::Done(answer),
            }
        }
    }
}

/// Builds the request (with a `content-length` of `body_len` unless the
/// caller gave one, see [`crate::http::with_content_length`]), hands it to
/// the host and opens the body for writing.
fn begin(post: Post<'_>, body_len: usize) -> Result<Phase, Outcome> {
    let headers = crate::http::with_content_length(post.headers, body_len);
    let fields = Fields::from_list(&headers).map_err(|err| {
        Outcome::Reject(match err {
            HeaderError::Forbidden => "a request header is forbidden by the host".into(),
            _ => "a request header is not valid HTTP".into(),
        })
    })?;
    let request = OutgoingRequest::new(fields);
    let target = post.url;
    let scheme = if target.https {
        Scheme::Https
    } else {
        Scheme::Http
    };
    let accepted = request.set_method(&Method::Post).is_ok()
        && request.set_scheme(Some(&scheme)).is_ok()
        && request.set_authority(Some(&target.authority)).is_ok()
        && request
            .set_path_with_query(Some(&target.path_with_query))
            .is_ok();
    if !accepted {
        return Err(outcome::retry("the host refused the configured url"));
    }
    let Ok(body) = request.body() else {
        return Err(outcome::retry("the host gave the request no body"));
    };

    // Setting a timeout may be refused by a host that does not support it;
    // its own ceilings then apply.
    let options = RequestOptions::new();
    let timeout = Some(u64::try_from(post.timeout.as_nanos()).unwrap_or(u64::MAX));
    let _ = options.set_connect_timeout(timeout);
    let _ = options.set_first_byte_timeout(timeout);
    let _ = options.set_between_bytes_timeout(timeout);

    let response = match outgoing_handler::handle(request, Some(options)) {
        Ok(response) => response,
        // `body` is dropped unfinished, which aborts it.
        Err(code) => return Err(outcome::transport_error(&code)),
    };
    Ok(match body.write() {
        Ok(stream) => Phase::Writing(Writing {
            ready: stream.subscribe(),
            stream,
            body,
            written: 0,
            response,
        }),
        Err(()) => {
            let _ = OutgoingBody::finish(body, None);
            Phase::Awaiting(Awaiting::new(response))
        }
    })
}

/// Writes as much of the body as the stream takes now.
fn write(mut w: Writing, body: &[u8]) -> Step {
    loop {
        let remaining = body.len().saturating_sub(w.written);
        if remaining == 0 {
            return match w.stream.flush() {
                Ok(()) => Step::Next(Phase::Flushing(w)),
                Err(_) => Step::Next(finish_body(w)),
            };
        }
        match w.stream.check_write() {
            Ok(0) => return Step::Wait(Phase::Writing(w)),
            Ok(permitted) => {
                let len = usize::try_from(permitted)
                    .unwrap_or(usize::MAX)
                    .min(remaining);
                let end = w.written + len;
                match w.stream.write(&body[w.written..end]) {
                    Ok(()) => w.written = end,
                    Err(_) => return Step::Next(finish_body(w)),
                }
            }
            Err(_) => return Step::Next(finish_body(w)),
        }
    }
}

/// Waits for the flush: the stream accepts writes again once it is done.
fn flush(w: Writing) -> Step {
    match w.stream.check_write() {
        Ok(0) => Step::Wait(Phase::Flushing(w)),
        _ => Step::Next(finish_body(w)),
    }
}

/// Closes the body, whether or not all of it was written, and moves on to
/// the response, which tells what happened.
fn finish_body(w: Writing) -> Phase {
    let Writing {
        ready,
        stream,
        body,
        response,
        ..
    } = w;
    drop(ready);
    drop(stream);
    // An error here (e.g. fewer bytes than content-length after a failed
    // write) is a consequence; the response future carries the cause.
    let _ = OutgoingBody::finish(body, None);
    Phase::Awaiting(Awaiting::new(response))
}

impl Awaiting {
    fn new(response: FutureIncomingResponse) -> Awaiting {
        Awaiting {
            ready: response.subscribe(),
            response,
        }
    }
}

fn await_response(a: Awaiting) -> Step {
    match a.response.get() {
        None => Step::Wait(Phase::Awaiting(a)),
        Some(Ok(Ok(response))) => {
            drop(a);
            start_reading(response)
        }
        Some(Ok(Err(code))) => Step::Done(Answer::Decided(outcome::transport_error(&code))),
        Some(Err(())) => Step::Done(Answer::Decided(outcome::retry(
            "the response was already taken",
        ))),
    }
}

/// Takes the status and headers, then opens the body for draining.
fn start_reading(response: IncomingResponse) -> Step {
    let status = response.status();
    // A 2xx answer is judged by its status alone: its headers are not
    // copied out of the host. The fields resource is a child of the
    // response, so it is gone before `consume`.
    let headers = if (200..300).contains(&status) {
        Vec::new()
    } else {
        response.headers().entries()
    };
    let Ok(body) = response.consume() else {
        return Step::Done(answer(status, headers, Vec::new()));
    };
    drop(response);
    let Ok(stream) = body.stream() else {
        return Step::Done(answer(status, headers, Vec::new()));
    };
    Step::Next(Phase::Reading(Reading {
        ready: stream.subscribe(),
        stream,
        body,
        status,
        headers,
        read: 0,
        kept: Vec::new(),
    }))
}

/// Reads what is there, up to [`RESPONSE_BODY_CAP`] in all.
fn read(mut r: Reading) -> Step {
    let keep = if (200..300).contains(&r.status) {
        0
    } else {
        outcome::REASON_BODY_BYTES
    };
    while r.read < RESPONSE_BODY_CAP {
        let want = (RESPONSE_BODY_CAP - r.read).min(READ_CHUNK);
        match r.stream.read(want as u64) {
            Ok(bytes) if bytes.is_empty() => return Step::Wait(Phase::Reading(r)),
            Ok(bytes) => {
                r.read += bytes.len();
                let room = keep.saturating_sub(r.kept.len());
                r.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
            // Closed: the body is complete. Failed: the status still decides.
            Err(_) => break,
        }
    }
    let Reading {
        ready,
        stream,
        body,
        status,
        headers,
        kept,
        ..
    } = r;
    drop(ready);
    drop(stream);
    drop(body);
    Step::Done(answer(status, headers, kept))
}

fn answer(status: u16, headers: Vec<Header>, body: Vec<u8>) -> Answer {
    Answer::Response(Response {
        status,
        headers,
        body,
    })
}

/// Wall-clock time since the unix epoch (`wasi:clocks/wall-clock`).
pub fn now() -> Duration {
    let now = wall_clock::now();
    Duration::from_secs(now.seconds).saturating_add(Duration::from_nanos(now.nanoseconds.into()))
}

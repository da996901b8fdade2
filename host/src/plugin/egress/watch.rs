//! Response timeouts of a plugin's HTTP request: the first-byte timeout,
//! the between-bytes (idle) timeout over the response head and body, and
//! the batch deadline, which no response may outlive.
//!
//! A receiver can hold a request in three ways, and each is told apart so
//! the guest (and the operator reading the retry reason) knows which: it
//! never answers (no byte within the first-byte timeout:
//! `HTTP-response-timeout`), it stops answering part-way (no byte within
//! the between-bytes timeout: `connection-read-timeout`), or it answers too
//! slowly to finish — a byte a second keeps any idle timeout quiet — so the
//! response is still incomplete shortly before the batch deadline
//! (`HTTP-response-incomplete`). The host's log line gives the figures
//! (how long, how many bytes).
//!
//! The head is watched through the connection's own byte count
//! ([`Metered`], below the TLS layer, so TLS records count as bytes), found
//! through hyper's connection capture — over HTTP/1.1 only, where a
//! connection carries one exchange at a time; over HTTP/2 the head must come
//! whole within the first-byte timeout — and the body frame by frame
//! ([`Watched`]).
//!
//! Must never: let a request outlive the batch deadline's margin, or
//! count a pooled connection's earlier response as this request's.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper_util::client::legacy::connect::{CaptureConnection, Connected, Connection};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use wasmtime_wasi_http::Error as HttpError;

/// What one connection received since its current request began to be
/// written. Shared between the connection ([`Metered`]) and the request's
/// watch.
#[derive(Debug, Default)]
pub struct Activity(Mutex<Received>);

#[derive(Debug, Default, Clone, Copy)]
struct Received {
    /// Bytes read since the last write began a request.
    bytes: u64,
    /// When the last of them came.
    last: Option<Instant>,
    /// Bytes were read since the last write: the next write begins a new
    /// request (HTTP/1.1 sends a request whole before its response).
    reading: bool,
}

impl Activity {
    fn wrote(&self) {
        let mut r = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if r.reading {
            *r = Received::default();
        }
    }

    fn read(&self, n: usize) {
        let mut r = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        r.bytes += n as u64;
        r.last = Some(Instant::now());
        r.reading = true;
    }

    /// Bytes received after `since`, and when the last came; nothing for
    /// bytes of an earlier exchange on the same pooled connection.
    fn since(&self, since: Instant) -> (u64, Option<Instant>) {
        let r = *self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match r.last {
            Some(last) if last >= since => (r.bytes, Some(last)),
            _ => (0, None),
        }
    }
}

/// The connection's [`Activity`], as hyper's connection capture hands it
/// to the request.
#[derive(Debug, Clone)]
struct ActivityOf(Arc<Activity>);

/// A plugin's TCP connection, counting the bytes it receives.
pub struct Metered {
    tcp: TcpStream,
    activity: Arc<Activity>,
}

impl Metered {
    /// Count what `tcp` receives from now on.
    pub fn new(tcp: TcpStream) -> Metered {
        Metered {
            tcp,
            activity: Arc::default(),
        }
    }
}

impl Metered {
    /// A write's result, noted: bytes written after a response begin the
    /// next request.
    fn wrote(&self, polled: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote();
        }
        polled
    }
}

impl AsyncRead for Metered {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.tcp).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            this.activity.read(n);
        }
        polled
    }
}

impl AsyncWrite for Metered {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.tcp).poll_write(cx, data);
        this.wrote(polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.tcp).poll_write_vectored(cx, bufs);
        this.wrote(polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().tcp).poll_shutdown(cx)
    }
}

impl Connection for Metered {
    /// The connection's activity as its one extra. Not the TCP stream's
    /// `HttpInfo` (its addresses), which nothing here reads: hyper copies
    /// a connection's extras into every response, one allocation each.
    fn connected(&self) -> Connected {
        Connected::new().extra(ActivityOf(self.activity.clone()))
    }
}

/// Why the host gave up on a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stall {
    /// Not one byte within the first-byte timeout.
    NoResponse {
        /// How long it waited.
        waited: Duration,
    },
    /// Bytes came, then none within the between-bytes timeout.
    Idle {
        /// How long no byte came.
        silent: Duration,
        /// Bytes received before.
        bytes: u64,
    },
    /// Still incomplete at the batch deadline's margin.
    Unfinished {
        /// Bytes received.
        bytes: u64,
        /// Time since the request was sent.
        elapsed: Duration,
    },
}

impl std::fmt::Display for Stall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stall::NoResponse { waited } => write!(f, "no response within {waited:?}"),
            Stall::Idle { silent, bytes } => write!(
                f,
                "response stalled: no byte for {silent:?} after {bytes} bytes"
            ),
            Stall::Unfinished { bytes, elapsed } => write!(
                f,
                "response unfinished before the batch deadline: {bytes} bytes in {elapsed:?}"
            ),
        }
    }
}

impl Stall {
    /// The `wasi:http` error the guest sees (module note).
    pub fn code(&self) -> HttpError {
        match self {
            Stall::NoResponse { .. } => HttpError::HttpResponseTimeout,
            Stall::Idle { .. } => HttpError::ConnectionReadTimeout,
            Stall::Unfinished { .. } => HttpError::HttpResponseIncomplete,
        }
    }
}

/// The timeouts of one request: the guest's asks clamped to the
/// manifest's `limits.first-byte-timeout` and `limits.between-bytes-timeout`,
/// and the instant the response must be complete by.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Longest wait for the first byte of the response.
    pub first_byte: Duration,
    /// Longest silence once bytes came.
    pub between_bytes: Duration,
    /// The batch deadline less [`crate::limits::DEADLINE_MARGIN`].
    pub until: Instant,
}

impl Timeouts {
    /// When to look again (`Ok`), or why the response is given up on, for a
    /// request handed over at `started` that has received `bytes`, the last
    /// at `last`.
    fn check(
        &self,
        started: Instant,
        bytes: u64,
        last: Option<Instant>,
        now: Instant,
    ) -> Result<Instant, Stall> {
        let idle_due = match last {
            None => started + self.first_byte,
            Some(last) => last + self.between_bytes,
        };
        if now >= self.until {
            return Err(Stall::Unfinished {
                bytes,
                elapsed: now - started,
            });
        }
        if now >= idle_due {
            return Err(match last {
                None => Stall::NoResponse {
                    waited: self.first_byte,
                },
                Some(_) => Stall::Idle {
                    silent: self.between_bytes,
                    bytes,
                },
            });
        }
        Ok(idle_due.min(self.until))
    }
}

/// Wait for `head` (the client's response future) under `timeouts`,
/// watching the bytes of the connection `captured` gives.
pub async fn head<F: Future>(
    head: F,
    captured: &CaptureConnection,
    started: Instant,
    timeouts: &Timeouts,
) -> Result<F::Output, Stall> {
    tokio::pin!(head);
    loop {
        let (bytes, last) = received(captured, started);
        let wake = timeouts.check(started, bytes, last, Instant::now())?;
        tokio::select! {
            out = &mut head => return Ok(out),
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
    }
}

/// What the captured connection received for this request so far. Over
/// HTTP/2 the connection carries other requests' frames too, so its bytes
/// say nothing of this request: nothing counts until the head comes, and
/// the first-byte timeout holds for the whole head.
fn received(captured: &CaptureConnection, started: Instant) -> (u64, Option<Instant>) {
    let metadata = captured.connection_metadata();
    let Some(connected) = metadata.as_ref() else {
        return (0, None);
    };
    if connected.is_negotiated_h2() {
        return (0, None);
    }
    let mut extensions = http::Extensions::new();
    connected.get_extras(&mut extensions);
    match extensions.get::<ActivityOf>() {
        Some(ActivityOf(activity)) => activity.since(started),
        None => (0, None),
    }
}

/// A response body read under the between-bytes timeout and the batch
/// deadline; a stall ends it with the [`Stall`]'s error (and a log line
/// naming the plugin and URL).
pub struct Watched<B> {
    body: B,
    timeouts: Timeouts,
    started: Instant,
    /// The connection the response comes on: what it received is read
    /// only when a stall is named (reading it is four allocations).
    captured: CaptureConnection,
    /// Body bytes read so far.
    bytes: u64,
    last: Instant,
    /// When the timeouts are next checked.
    check_at: Instant,
    /// The timer for `check_at`, made the first time the body is waited
    /// on: a response whose body is there with its head (most answers)
    /// never needs one.
    wake: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Who is reading, for the log line.
    plugin: Arc<str>,
    uri: http::Uri,
}

impl<B> Watched<B> {
    /// Watch `body`, whose head has just come on the connection
    /// `captured`, of a request handed over at `started`.
    pub fn new(
        body: B,
        timeouts: Timeouts,
        started: Instant,
        captured: CaptureConnection,
        plugin: Arc<str>,
        uri: http::Uri,
    ) -> Watched<B> {
        let now = Instant::now();
        let check_at = timeouts.check(started, 0, Some(now), now).unwrap_or(now);
        Watched {
            body,
            timeouts,
            started,
            captured,
            bytes: 0,
            last: now,
            check_at,
            wake: None,
            plugin,
            uri,
        }
    }
}

impl<B> http_body::Body for Watched<B>
where
    B: http_body::Body<Data = Bytes, Error = HttpError> + Unpin,
{
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, HttpError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.body).poll_frame(cx) {
            if let Some(Ok(frame)) = &frame {
                this.bytes += frame.data_ref().map_or(0, |d| d.len() as u64);
                this.last = Instant::now();
            }
            return Poll::Ready(frame);
        }
        let check_at = this.check_at;
        let wake = this
            .wake
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(check_at.into())));
        loop {
            if wake.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // The response's bytes so far: what its HTTP/1.1 connection
            // received for it (head and body), else (HTTP/2) the body's.
            let bytes = received(&this.captured, this.started).0.max(this.bytes);
            match this
                .timeouts
                .check(this.started, bytes, Some(this.last), Instant::now())
            {
                Ok(next) => wake.as_mut().reset(next.into()),
                Err(stall) => {
                    tracing::warn!(plugin = %this.plugin, uri = %this.uri, "outbound response body given up: {stall}");
                    return Poll::Ready(Some(Err(stall.code())));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_way_of_holding_a_request_is_named() {
        let started = Instant::now();
        let t = Timeouts {
            first_byte: Duration::from_secs(5),
            between_bytes: Duration::from_secs(2),
            until: started + Duration::from_secs(20),
        };
        let at = |s: u64| started + Duration::from_secs(s);
        assert_eq!(t.check(started, 0, None, at(1)), Ok(at(5)));
        assert_eq!(
            t.check(started, 0, None, at(5)),
            Err(Stall::NoResponse {
                waited: Duration::from_secs(5)
            })
        );
        assert_eq!(t.check(started, 37, Some(at(3)), at(4)), Ok(at(5)));
        assert_eq!(
            t.check(started, 37, Some(at(3)), at(5)),
            Err(Stall::Idle {
                silent: Duration::from_secs(2),
                bytes: 37
            })
        );
        // A byte a second keeps the idle timeout quiet; the deadline holds.
        assert_eq!(t.check(started, 19, Some(at(19)), at(19)), Ok(at(20)));
        assert_eq!(
            t.check(started, 20, Some(at(20)), at(20)),
            Err(Stall::Unfinished {
                bytes: 20,
                elapsed: Duration::from_secs(20)
            })
        );
    }
}

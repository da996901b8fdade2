#!/usr/bin/env python3
"""Webhook receiver for outboxd demos and tests.

Accepts POSTs signed per the Standard Webhooks specification, records one
JSON line per request and exposes running totals at GET /stats.

    python3 scripts/receiver.py --port 9090 --secret whsec_... --out recv.jsonl

Answers 200 for a verified request and 401 otherwise.  With --fail-first N
the first N requests are answered 503 (without being recorded as received)
so that the sender's retry path can be exercised (they are counted in
`injected_failures` at /stats, not in `received`).

A request's id is its ce-id header (falling back to webhook-id).  `unique`
counts distinct ids of verified requests; a verified request whose id was
already seen is a re-delivery.  An order violation is a verified, first-time
request whose ce-sequence is lower than the highest one already seen on its
stream (ce-partitionkey).
"""

import argparse
import base64
import binascii
import hashlib
import hmac
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE_SECONDS = 5 * 60
MAX_BODY = 64 * 1024 * 1024


def decode_secret(secret):
    """Return the HMAC key of a `whsec_<base64>` secret."""
    if not secret.startswith("whsec_"):
        raise ValueError("secret must start with 'whsec_'")
    raw = secret[len("whsec_"):]
    try:
        return base64.b64decode(raw + "=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"secret is not valid base64: {exc}") from None


def sign(key, msg_id, timestamp, body):
    """Standard Webhooks v1 signature (base64 of HMAC-SHA256)."""
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256)
    return base64.b64encode(mac.digest()).decode()


def verify(key, headers, body, now=None):
    """Return (ok, reason) for a request's webhook-* headers and body."""
    msg_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp")
    signatures = headers.get("webhook-signature")
    if not msg_id or not timestamp or not signatures:
        return False, "missing webhook-id, webhook-timestamp or webhook-signature"
    try:
        ts = int(timestamp)
    except ValueError:
        return False, "webhook-timestamp is not an integer"
    now = time.time() if now is None else now
    if abs(now - ts) > TOLERANCE_SECONDS:
        return False, "webhook-timestamp outside the tolerance window"
    expected = sign(key, msg_id, timestamp, body).encode()
    for entry in signatures.split():
        version, sep, value = entry.partition(",")
        if sep and version == "v1" and hmac.compare_digest(value.encode(), expected):
            return True, "ok"
    return False, "no matching v1 signature"


class State:
    def __init__(self, out_path, fail_first):
        self.lock = threading.Lock()
        self.out_path = out_path
        self.fail_remaining = fail_first
        self.injected_failures = 0
        self.received = 0
        self.ids = set()
        self.verified_failures = 0
        self.order_violations = 0
        self.max_seq = {}  # stream -> highest ce-sequence seen

    def take_failure(self):
        with self.lock:
            if self.fail_remaining > 0:
                self.fail_remaining -= 1
                self.injected_failures += 1
                return True
            return False

    def record(self, entry):
        with self.lock:
            self.received += 1
            if not entry["verified"]:
                self.verified_failures += 1
            msg_id = entry["id"]
            redelivery = msg_id is not None and msg_id in self.ids
            if msg_id is not None and entry["verified"]:
                self.ids.add(msg_id)
            stream, seq = entry["stream"], entry["sequence"]
            if entry["verified"] and not redelivery and seq is not None:
                highest = self.max_seq.get(stream)
                if highest is not None and seq < highest:
                    self.order_violations += 1
                if highest is None or seq > highest:
                    self.max_seq[stream] = seq
            if self.out_path:
                with open(self.out_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(entry, separators=(",", ":")) + "\n")

    def stats(self):
        with self.lock:
            return {
                "received": self.received,
                "unique": len(self.ids),
                "verified_failures": self.verified_failures,
                "per_stream_order_violations": self.order_violations,
                "injected_failures": self.injected_failures,
            }


def make_handler(key, state, verbose):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "outboxd-receiver/1"
        # Buffer each response and send it in one write (headers and body
        # written separately cost ~40 ms per request with delayed ACKs).
        wbufsize = -1

        def log_message(self, fmt, *args):
            if verbose:
                sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))

        def _reply(self, code, payload):
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _read_body(self):
            length = self.headers.get("Content-Length")
            if length is None:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    return self._read_chunked()
                return b""
            n = int(length)
            if n < 0 or n > MAX_BODY:
                raise ValueError("bad Content-Length")
            return self.rfile.read(n)

        def _read_chunked(self):
            chunks = []
            total = 0
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    # skip trailers up to the blank line
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                total += size
                if total > MAX_BODY:
                    raise ValueError("body too large")
                chunks.append(self.rfile.read(size))
                self.rfile.readline(65537)

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/stats":
                self._reply(200, state.stats())
            elif path in ("/health", "/"):
                self._reply(200, {"status": "ok"})
            else:
                self._reply(404, {"error": "not found"})

        def do_POST(self):
            try:
                body = self._read_body()
            except (ValueError, OSError):
                self.close_connection = True
                self._reply(400, {"error": "unreadable body"})
                return
            if state.take_failure():
                if verbose:
                    sys.stderr.write("injected failure: 503\n")
                self._reply(503, {"error": "injected failure"})
                return
            verified, reason = verify(key, self.headers, body)
            seq_header = self.headers.get("ce-sequence")
            try:
                sequence = int(seq_header) if seq_header is not None else None
            except ValueError:
                sequence = None
            entry = {
                "id": self.headers.get("ce-id") or self.headers.get("webhook-id"),
                "stream": self.headers.get("ce-partitionkey"),
                "sequence": sequence,
                "type": self.headers.get("ce-type"),
                "verified": verified,
                "received_at": time.time(),
                "bytes": len(body),
            }
            state.record(entry)
            if verbose:
                sys.stderr.write(
                    "%s stream=%s seq=%s type=%s verified=%s (%s)\n"
                    % (entry["id"], entry["stream"], sequence, entry["type"], verified, reason)
                )
            if verified:
                self._reply(200, {"status": "ok"})
            else:
                self._reply(401, {"error": reason})

    return Handler


def main(argv=None):
    parser = argparse.ArgumentParser(description="Standard Webhooks receiver for outboxd")
    parser.add_argument("--port", type=int, default=9090)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--secret", required=True, help="whsec_<base64> signing secret")
    parser.add_argument("--out", help="append one JSON line per received request")
    parser.add_argument("--fail-first", type=int, default=0, metavar="N",
                        help="answer 503 to the first N requests")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)

    try:
        key = decode_secret(args.secret)
    except ValueError as exc:
        parser.error(str(exc))

    state = State(args.out, max(0, args.fail_first))
    server = ThreadingHTTPServer((args.host, args.port), make_handler(key, state, args.verbose))
    server.daemon_threads = True
    if args.verbose:
        sys.stderr.write(f"receiver listening on {args.host}:{args.port}\n")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)
    sys.exit(main())

"""The two receiving ends of the run, each recording every arrival in order.

- `WebhookReceiver`: an HTTP server on 127.0.0.1 that verifies every request
  with the `standardwebhooks` package (signature and timestamp) and parses it
  with the CloudEvents SDK's HTTP binding (`from_http`, binary mode).
- `AmqpConsumer`: a `pika` consumer of a queue bound `#` to the run's topic
  exchange; each message is parsed with the SDK's AMQP binding (outboxd puts
  the `cloudEvents_*` attributes in the AMQP 0-9-1 headers table, which is
  what the binding's application properties map to on RabbitMQ).

Each arrival is checked against the event that was sent (looked up by id):
data byte for byte and as parsed JSON, and the attributes. Order and
completeness are judged afterwards, from the arrival lists.
"""

import hashlib
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pika
from cloudevents.core.bindings import amqp as ce_amqp
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.formats.json import JSONFormat
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

JSON_FORMAT = JSONFormat()


@dataclass
class Arrival:
    id: str | None
    stream: str | None
    sequence: int | None
    sha256: str
    at: float
    signature_ok: bool  # always True where the transport has no signature
    problems: list  # what did not match the event sent (empty when all did)


class Ledger:
    """Arrivals of one sink, in the order they were received."""

    def __init__(self, sink, expected):
        self.sink = sink
        self.expected = expected  # id -> events.Event
        self.lock = threading.Lock()
        self.arrivals = []
        self.unique = set()

    def record(self, arrival):
        with self.lock:
            self.arrivals.append(arrival)
            if arrival.id is not None and arrival.signature_ok:
                self.unique.add(arrival.id)

    def unique_count(self):
        with self.lock:
            return len(self.unique & self.expected.keys())

    def snapshot(self):
        with self.lock:
            return list(self.arrivals)


def compare(ev, attrs, data, body, problems):
    """Append to `problems` whatever differs from the event sent."""
    if ev is None:
        problems.append("unknown id")
        return
    if hashlib.sha256(body).hexdigest() != ev.sha256:
        problems.append(f"data bytes differ ({len(body)} bytes received, {len(ev.data)} sent)")
    if data != ev.payload:
        problems.append("parsed data differs")
    for name, want in (("type", ev.type), ("source", ev.source), ("subject", ev.subject),
                       ("partitionkey", ev.stream), ("datacontenttype", "application/json"),
                       ("specversion", "1.0"), ("time", ev.time)):
        got = attrs.get(name)
        if got != want:
            problems.append(f"{name}: got {got!r}, sent {want!r}")


def _int_or_none(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class WebhookReceiver:
    def __init__(self, ledger, secret, delay_s=0.0):
        self.ledger = ledger
        self.webhook = Webhook(secret)
        self.delay_s = delay_s
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="webhook", daemon=True)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self):
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def handle(self, headers, body):
        """Verify, parse, check and record one request; return the HTTP status."""
        problems = []
        try:
            self.webhook.verify(body, headers, json_parse=False)
            signature_ok = True
        except (WebhookVerificationError, ValueError) as exc:
            signature_ok = False
            problems.append(f"signature: {exc} (body of {len(body)} bytes)")
        event_id = stream = sequence = None
        try:
            event = ce_http.from_http(ce_http.HTTPMessage(headers=headers, body=body), JSON_FORMAT)
            attrs = event.get_attributes()
            event_id, stream = attrs.get("id"), attrs.get("partitionkey")
            sequence = _int_or_none(attrs.get("sequence"))
            compare(self.ledger.expected.get(event_id), attrs, event.get_data(), body, problems)
            if headers.get("webhook-id") != event_id:
                problems.append("webhook-id is not the event id")
        except Exception as exc:  # the SDK refused the request
            problems.append(f"CloudEvents HTTP binding: {type(exc).__name__}: {exc}")
        self.ledger.record(Arrival(event_id, stream, sequence, hashlib.sha256(body).hexdigest(),
                                   time.time(), signature_ok, problems))
        if self.delay_s:
            time.sleep(self.delay_s)
        if not signature_ok:
            return 401
        return 400 if event_id is None else 200

    def _handler(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Buffered: each response leaves in one write (flushed after each
            # request), not headers and body in two small TCP segments.
            wbufsize = -1

            def log_message(self, fmt, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                if len(body) < length:
                    # The sender went away mid-body (a SIGKILL of the soak):
                    # an incomplete message (RFC 9112 §8), never answered, so
                    # neither recorded nor counted as delivered.
                    self.close_connection = True
                    return
                headers = {k.lower(): v for k, v in self.headers.items()}
                status = receiver.handle(headers, body)
                reply = json.dumps({"status": status}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        return Handler


class AmqpConsumer:
    """Consumes one queue with pika in a thread of its own (reconnecting if the
    connection drops); acknowledges each message after recording it."""

    def __init__(self, ledger, url, queue):
        self.ledger = ledger
        self.params = pika.URLParameters(url)
        self.queue = queue
        self.stopping = threading.Event()
        self.connected = threading.Event()
        self.errors = []
        self.thread = threading.Thread(target=self._run, name="amqp", daemon=True)

    def start(self):
        self.thread.start()
        if not self.connected.wait(20):
            raise RuntimeError(f"pika consumer did not connect: {self.errors[-1:]}")

    def stop(self):
        self.stopping.set()
        self.thread.join(10)

    def _run(self):
        while not self.stopping.is_set():
            try:
                conn = pika.BlockingConnection(self.params)
                ch = conn.channel()
                ch.basic_qos(prefetch_count=500)
                ch.basic_consume(self.queue, self._on_message, auto_ack=False)
                self.connected.set()
                while not self.stopping.is_set():
                    conn.process_data_events(time_limit=0.2)
                conn.close()
            except Exception as exc:  # connection lost: connect again
                self.errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(1)

    def _on_message(self, ch, method, props, body):
        headers = {k: (v.decode("utf-8", "replace") if isinstance(v, bytes) else v)
                   for k, v in (props.headers or {}).items()}
        properties = {"content-type": props.content_type} if props.content_type else {}
        problems = []
        event_id = stream = sequence = None
        try:
            event = ce_amqp.from_amqp(
                ce_amqp.AMQPMessage(properties=properties, application_properties=headers,
                                    application_data=body), JSON_FORMAT)
            attrs = event.get_attributes()
            event_id, stream = attrs.get("id"), attrs.get("partitionkey")
            sequence = _int_or_none(attrs.get("sequence"))
            compare(self.ledger.expected.get(event_id), attrs, event.get_data(), body, problems)
            if props.message_id != event_id:
                problems.append(f"message-id {props.message_id!r} is not the event id")
            if props.delivery_mode != 2:
                problems.append(f"delivery-mode {props.delivery_mode}, not persistent (2)")
        except Exception as exc:
            problems.append(f"CloudEvents AMQP binding: {type(exc).__name__}: {exc}")
        self.ledger.record(Arrival(event_id, stream, sequence, hashlib.sha256(body).hexdigest(),
                                   time.time(), True, problems))
        ch.basic_ack(method.delivery_tag)


def declare_amqp(url, exchange, queue):
    """A topic exchange and a queue bound to it with `#` (every routing key)."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.exchange_declare(exchange, exchange_type="topic", durable=True)
        ch.queue_declare(queue, durable=True)
        ch.queue_bind(queue, exchange, routing_key="#")
    finally:
        conn.close()


def delete_amqp(url, exchange, queue):
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.queue_delete(queue)
        ch.exchange_delete(exchange)
    finally:
        conn.close()

#!/usr/bin/env python3
"""End-to-end demo of outboxd: accept events, deliver them to a signed webhook.

Starts a webhook receiver (scripts/receiver.py) and the daemon on a fresh data
directory, posts a set of CloudEvents to the daemon's API and waits until the
receiver has seen every one of them, verified and in order per stream.

    python3 scripts/quickstart.py --outboxd target/debug/outboxd \\
        --plugins-dir target/plugins [--cases DIR]

With a cases folder of GitHub webhook payloads (default:
tests/cases/github-webhooks in the repository, when present) each
`*.json` file becomes one event; otherwise 50 sample events over 5 streams
are generated.  Exits 0 only when all events were delivered, verified and in
order.
"""

import argparse
import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CASES = REPO_ROOT / "tests" / "cases" / "github-webhooks"
# Batches stay under the default 1 MiB body limit (ingest.max-body-bytes)
# even with the largest payloads of the GitHub set (31 KiB each).
BATCH_SIZE = 25
BATCH_CONTENT_TYPE = "application/cloudevents-batch+json"
ACTION_WORD = re.compile(r"[a-z_]+")

# Talk to 127.0.0.1 directly, whatever proxy the environment names.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class QuickstartError(Exception):
    pass


# --------------------------------------------------------------------------
# HTTP helpers


def http(method, url, body=None, content_type=None, timeout=30):
    """Return (status, body bytes); HTTP error statuses are returned, not raised."""
    headers = {"Content-Type": content_type} if content_type else {}
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with _HTTP.open(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(url, timeout=10):
    status, body = http("GET", url, timeout=timeout)
    if status != 200:
        raise QuickstartError(f"GET {url} answered {status}: {body[:500]!r}")
    return json.loads(body)


# --------------------------------------------------------------------------
# Events


def stream_of(payload):
    """repository.full_name, else organization.login, else sender.login."""
    if isinstance(payload, dict):
        for field, key in (("repository", "full_name"), ("organization", "login"), ("sender", "login")):
            obj = payload.get(field)
            if isinstance(obj, dict) and isinstance(obj.get(key), str) and obj[key]:
                return obj[key]
    return "github"


def type_of(rel_path, payload):
    """Folder name, plus the file name's first word where that is an action."""
    folder = rel_path.parts[0] if len(rel_path.parts) > 1 else "github"
    word = rel_path.name.split(".", 1)[0]
    action = payload.get("action") if isinstance(payload, dict) else None
    if (isinstance(action, str) and word.replace("-", "_") == action) or (
        ACTION_WORD.fullmatch(word) and word != "payload"
    ):
        return f"{folder}.{word.replace('-', '_')}"
    return folder


def assemble(attrs, raw_data):
    """One CloudEvent in JSON with `raw_data` spliced in verbatim as "data"."""
    head = json.dumps(attrs, separators=(",", ":")).encode()
    assert head.endswith(b"}")
    return head[:-1] + b',"data":' + raw_data + b"}"


def events_from_cases(cases_dir):
    """[(event bytes, id, stream, type, subject)] for every *.json, sorted."""
    events = []
    for path in sorted(p for p in cases_dir.rglob("*.json") if p.is_file()):
        rel = path.relative_to(cases_dir)
        raw = path.read_bytes()
        if raw.startswith(b"\xef\xbb\xbf"):
            raise QuickstartError(f"{path}: starts with a byte order mark")
        try:
            payload = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise QuickstartError(f"{path}: not UTF-8 JSON: {exc}") from None
        stream = stream_of(payload)
        etype = type_of(rel, payload)
        event_id = str(uuid.uuid4())
        attrs = {
            "specversion": "1.0",
            "id": event_id,
            "source": f"https://github.com/{stream}",
            "type": f"com.github.{etype}",
            "subject": rel.as_posix(),
            "datacontenttype": "application/json",
            "partitionkey": stream,
        }
        events.append((assemble(attrs, raw), event_id, stream, etype, rel.as_posix()))
    return events


def sample_events(count=50, streams=5):
    events = []
    for i in range(count):
        stream = f"sample-{i % streams}"
        event_id = str(uuid.uuid4())
        attrs = {
            "specversion": "1.0",
            "id": event_id,
            "source": f"urn:outboxd:quickstart:{stream}",
            "type": "dev.outboxd.sample",
            "subject": f"sample/{i}",
            "datacontenttype": "application/json",
            "partitionkey": stream,
        }
        raw = json.dumps({"n": i, "note": "sample"}).encode()
        events.append((assemble(attrs, raw), event_id, stream, "sample", f"sample/{i}"))
    return events


def post_events(base_url, events):
    """POST in batches; returns {id: (stream, sequence)} from the answers."""
    accepted = {}
    for start in range(0, len(events), BATCH_SIZE):
        batch = events[start:start + BATCH_SIZE]
        body = b"[" + b",".join(e[0] for e in batch) + b"]"
        status, resp = http("POST", f"{base_url}/v1/events", body, BATCH_CONTENT_TYPE, timeout=60)
        if status != 201:
            raise QuickstartError(
                f"POST /v1/events (events {start}..{start + len(batch) - 1}) answered {status}: "
                f"{resp[:1000].decode('utf-8', 'replace')}")
        try:
            results = json.loads(resp)["events"]
        except (ValueError, KeyError, TypeError):
            raise QuickstartError(f"POST /v1/events: unexpected answer {resp[:1000]!r}") from None
        if len(results) != len(batch):
            raise QuickstartError(f"POST /v1/events: {len(results)} results for {len(batch)} events")
        for sent, result in zip(batch, results):
            _, event_id, stream, _, subject = sent
            if result.get("id") != event_id:
                raise QuickstartError(f"{subject}: answered id {result.get('id')!r}, sent {event_id}")
            if result.get("stream") != stream:
                raise QuickstartError(f"{subject}: answered stream {result.get('stream')!r}, sent {stream!r}")
            if result.get("duplicate"):
                raise QuickstartError(f"{subject}: accepted as a duplicate")
            accepted[event_id] = (stream, result.get("sequence"))
    return accepted


# --------------------------------------------------------------------------
# Processes


def tail(path, lines=40):
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def stop(proc, name):
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        print(f"{name} did not stop within 10s; killing it", file=sys.stderr)
        proc.kill()
        proc.wait()


def ensure_port_free(port, what):
    """Fail early rather than talk to whatever else already listens there."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise QuickstartError(f"{what} port {port} is not free ({exc.strerror}); "
                                  f"choose another with --{'receiver-' if what == 'receiver' else ''}port")


def wait_ready(url, proc, name, log_path, timeout, show_log=True):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise QuickstartError(
                f"{name} exited with status {proc.returncode} before answering {url}"
                + (f"\n--- {log_path} (tail) ---\n{tail(log_path)}" if show_log else ""))
        try:
            status, _ = http("GET", url, timeout=2)
            # Only our own child counts: it must still be running after answering.
            if status == 200 and proc.poll() is None:
                return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.2)
    raise QuickstartError(f"{name} did not answer {url} within {timeout}s"
                          + (f"\n--- {log_path} (tail) ---\n{tail(log_path)}" if show_log else ""))


# --------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outboxd", required=True, help="path of the outboxd binary")
    parser.add_argument("--plugins-dir", required=True, help="directory of sink plugins")
    parser.add_argument("--cases", help=f"folder of webhook payloads (default {DEFAULT_CASES} if present)")
    parser.add_argument("--port", type=int, default=8080, help="daemon API port")
    parser.add_argument("--receiver-port", type=int, default=9090)
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for delivery")
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # keep stdout and stderr in order

    outboxd = Path(args.outboxd).resolve()
    plugins_dir = Path(args.plugins_dir).resolve()
    if not outboxd.is_file():
        parser.error(f"--outboxd {args.outboxd}: no such file")
    if not plugins_dir.is_dir():
        parser.error(f"--plugins-dir {args.plugins_dir}: no such directory")

    cases_dir = Path(args.cases) if args.cases else DEFAULT_CASES
    if cases_dir.is_dir():
        events = events_from_cases(cases_dir)
        origin = f"{len(events)} payloads from {cases_dir}"
    else:
        if args.cases:
            print(f"cases folder {args.cases} not found; using sample events", file=sys.stderr)
        events = sample_events()
        origin = f"{len(events)} sample events"
    if not events:
        raise QuickstartError(f"no *.json files under {cases_dir}")
    if args.port == args.receiver_port:
        parser.error("--port and --receiver-port must differ")
    ensure_port_free(args.receiver_port, "receiver")
    ensure_port_free(args.port, "outboxd")

    tmp = Path(tempfile.mkdtemp(prefix="outboxd-quickstart-"))
    data_dir = tmp / "data"
    data_dir.mkdir()
    daemon_log = tmp / "outboxd.log"
    receiver_log = tmp / "receiver.log"
    received_file = tmp / "received.jsonl"
    secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
    api = f"http://127.0.0.1:{args.port}"
    receiver_url = f"http://127.0.0.1:{args.receiver_port}"

    receiver = daemon = None
    ok = False
    try:
        print(f"data dir:  {data_dir}")
        print(f"events:    {origin}")

        with open(receiver_log, "wb") as log:
            receiver = subprocess.Popen(
                [sys.executable, str(REPO_ROOT / "scripts" / "receiver.py"),
                 "--port", str(args.receiver_port), "--secret", secret,
                 "--out", str(received_file)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        wait_ready(f"{receiver_url}/stats", receiver, "receiver", receiver_log, 15)

        env = dict(os.environ)
        env.update({
            "OUTBOXD_DATA_DIR": str(data_dir),
            "OUTBOXD_PLUGINS_DIR": str(plugins_dir),
            "OUTBOXD_LISTEN": f"127.0.0.1:{args.port}",
            "OUTBOXD_WEBHOOK_SECRET": secret,
            "OUTBOXD_WEBHOOK_URL": f"{receiver_url}/webhook",
            "OUTBOXD_WEBHOOK_ALLOW": receiver_url,
        })
        env.setdefault("RUST_LOG", "info")
        for var in ("NO_PROXY", "no_proxy"):
            env[var] = ",".join(filter(None, [env.get(var), "127.0.0.1", "localhost"]))
        with open(daemon_log, "wb") as log:
            daemon = subprocess.Popen(
                [str(outboxd), "run"], env=env, cwd=tmp,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        # (the daemon's log tail is printed on any failure below)
        wait_ready(f"{api}/health", daemon, "outboxd", daemon_log, args.timeout, show_log=False)
        print(f"outboxd:   {api} (log {daemon_log})")

        started = time.monotonic()
        accepted = post_events(api, events)
        posted_in = time.monotonic() - started
        print(f"posted:    {len(accepted)} events in {posted_in:.2f}s")

        deadline = started + args.timeout
        stats = get_json(f"{receiver_url}/stats")
        while stats["unique"] < len(events) and time.monotonic() < deadline:
            if daemon.poll() is not None:
                print(f"outboxd exited with status {daemon.returncode}", file=sys.stderr)
                break
            time.sleep(0.25)
            stats = get_json(f"{receiver_url}/stats")
        elapsed = time.monotonic() - started
        # A moment more, so that a late re-delivery or violation shows up too.
        time.sleep(0.5)
        stats = get_json(f"{receiver_url}/stats")

        redeliveries = stats["received"] - stats["unique"] - stats["verified_failures"]
        streams = len({stream for stream, _ in accepted.values()})
        print()
        print(f"events sent:         {len(events)} over {streams} streams")
        print(f"delivered (unique):  {stats['unique']}")
        print(f"re-deliveries:       {redeliveries}")
        print(f"signature failures:  {stats['verified_failures']}")
        print(f"order violations:    {stats['per_stream_order_violations']}")
        print(f"elapsed:             {elapsed:.2f}s")

        ok = (stats["unique"] == len(events)
              and stats["verified_failures"] == 0
              and stats["per_stream_order_violations"] == 0)
        if not ok:
            report_missing(api, accepted, events, received_file)
    except QuickstartError as exc:
        print(f"error: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        stop(daemon, "outboxd")
        stop(receiver, "receiver")

    if ok:
        print("\nOK: every event delivered, verified and in order")
        shutil.rmtree(tmp, ignore_errors=True)
        return 0
    print("\nFAILED", file=sys.stderr)
    if daemon is not None:
        print(f"--- {daemon_log} (tail) ---\n{tail(daemon_log)}", file=sys.stderr)
    print(f"(kept {tmp} for inspection)", file=sys.stderr)
    return 1


def report_missing(api, accepted, events, received_file, limit=5):
    """Show the daemon's delivery state of a few events the receiver lacks."""
    seen = set()
    try:
        with open(received_file, encoding="utf-8") as fh:
            for line in fh:
                entry = json.loads(line)
                if entry.get("verified"):
                    seen.add(entry.get("id"))
    except OSError:
        pass
    missing = [e for e in events if e[1] not in seen]
    if not missing:
        return
    print(f"\n{len(missing)} events not delivered; the first {min(limit, len(missing))}:", file=sys.stderr)
    for _, event_id, stream, etype, subject in missing[:limit]:
        try:
            status, body = http("GET", f"{api}/v1/events/{event_id}", timeout=5)
            detail = json.loads(body).get("deliveries") if status == 200 else f"HTTP {status}"
        except (OSError, ValueError, urllib.error.URLError) as exc:
            detail = f"unavailable ({exc})"
        print(f"  {subject} [{stream} seq {accepted.get(event_id, (None, None))[1]}]: {detail}",
              file=sys.stderr)


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        sys.exit(main())
    except QuickstartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)

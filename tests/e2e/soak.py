#!/usr/bin/env python3
"""Soak: many events through the webhook and amqp sinks while outboxd is
killed again and again and the broker restarts.

Run by tests/e2e/soak.sh (which creates the virtual environment and builds
outboxd and its plugins); by hand:

    target/e2e-venv/bin/python tests/e2e/soak.py \\
        --outboxd target/debug/outboxd --plugins-src target/plugins \\
        [--events N] [--kills K] [--broker-restarts R]

1. A RabbitMQ node of the run's own (its own node name, ports and data
   folder, started with `rabbitmq-server -detached`), so restarting it
   disturbs no other user of the machine's broker; a fresh PostgreSQL
   database on the local server; the shipped `webhook` and `amqp` sinks
   with a short `[limits] deadline` and the least lease the daemon accepts
   (2 x deadline + 5 s), as in tests/e2e/real_input.py.
2. --events events over --streams streams, POSTed in batches by a few
   threads (a stream's events by one thread, in order); a batch that gets no
   answer or a 503 is sent again, ids unchanged, until it is answered 2xx.
3. The receivers of tests/e2e/receivers.py: a webhook server verifying
   every request (`standardwebhooks`, the SDK's HTTP binding) and a `pika`
   consumer of a queue bound `#` to the run's exchange.
4. Faults at random moments, spread over the run by its progress (events
   acknowledged plus first arrivals at both sinks): --kills SIGKILLs of
   outboxd, each restarted on the same database and port after a short
   pause, and --broker-restarts `rabbitmqctl stop_app` / `start_app` of the
   run's broker with a few seconds down.
5. The report, per sink: arrivals, unique ids, re-deliveries, order
   violations (a first arrival while an earlier event of its stream had not
   arrived), missing events, content or signature problems. Exit status 1
   on any loss, order violation or content problem, or when the run stalls.
"""

import argparse
import collections
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
from http.client import HTTPException
from pathlib import Path

import daemon as d
import events as e
import real_input as ri
import receivers as r

REPO_ROOT = Path(__file__).resolve().parents[2]
SINKS = ("webhook", "amqp")
# The time every event carries (the receivers compare it with what arrives).
EVENT_TIME = "2026-12-01T00:00:00Z"


def log(t0, msg):
    print(f"[{time.monotonic() - t0:7.1f}s] {msg}", flush=True)


class RunError(Exception):
    pass


# --------------------------------------------------------------------------
# The run's own broker


class Broker:
    """A RabbitMQ node of the run's own: node name, AMQP and distribution
    ports and data folder its own, no plugins."""

    def __init__(self, tag):
        self.node = f"outboxd-soak-{tag}@localhost"
        self.port = d.free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"outboxd-soak-{tag}-rabbit-"))
        if os.geteuid() == 0:
            shutil.chown(self.dir, "rabbitmq", "rabbitmq")
        self.env = dict(os.environ,
                        RABBITMQ_NODENAME=self.node,
                        RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
                        RABBITMQ_NODE_PORT=str(self.port),
                        RABBITMQ_DIST_PORT=str(d.free_port()),
                        RABBITMQ_MNESIA_BASE=str(self.dir / "mnesia"),
                        RABBITMQ_LOG_BASE=str(self.dir / "log"),
                        RABBITMQ_ENABLED_PLUGINS_FILE=str(self.dir / "enabled_plugins"),
                        RABBITMQ_PID_FILE=str(self.dir / "pid"))
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/%2f"

    def ctl(self, *args, timeout=90):
        out = subprocess.run(["rabbitmqctl", "-n", self.node, *args], env=self.env,
                             capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RunError(f"rabbitmqctl {' '.join(args)}: {out.stderr.strip()[-400:]}")

    def start(self):
        out = subprocess.run(["rabbitmq-server", "-detached"], env=self.env,
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RunError(f"rabbitmq-server -detached: {out.stderr.strip()[-400:]}")
        self.ctl("wait", str(self.dir / "pid"), "--timeout", "90")

    def restart(self, down_s):
        """`stop_app`, `down_s` seconds down, `start_app`."""
        self.ctl("stop_app")
        time.sleep(down_s)
        self.ctl("start_app")

    def stop(self):
        try:
            self.ctl("stop", timeout=60)
        except (RunError, subprocess.TimeoutExpired) as exc:
            print(f"stopping the run's broker: {exc}", flush=True)
        shutil.rmtree(self.dir, ignore_errors=True)


# --------------------------------------------------------------------------
# Events


def make_events(n, streams, tag, sdk_time):
    """{id: events.Event} and the ids of each stream in send order. Event i
    is on stream `s{i % streams}`; its data names it."""
    expected = {}
    by_stream = collections.defaultdict(list)
    for i in range(n):
        stream = f"s{i % streams}"
        eid = f"soak-{tag}-{i}"
        payload = {"n": i, "stream": stream, "note": "soak"}
        raw = json.dumps(payload, separators=(",", ":")).encode()
        envelope = {"specversion": "1.0", "id": eid, "source": "https://example.com/soak",
                    "type": "com.example.soak", "subject": f"n{i}", "time": EVENT_TIME,
                    "datacontenttype": "application/json", "partitionkey": stream}
        body = json.dumps(envelope)[:-1].encode() + b', "data": ' + raw + b"}"
        expected[eid] = e.Event(
            id=eid, stream=stream, type=envelope["type"], source=envelope["source"],
            subject=envelope["subject"], time=sdk_time, raw=raw, payload=payload, body=body,
            content_type="application/cloudevents+json", label=f"n{i}")
        by_stream[stream].append(eid)
    return expected, by_stream


def sdk_time():
    """EVENT_TIME as the CloudEvents SDK reads it back."""
    from cloudevents.core.bindings import http as ce_http
    body = json.dumps({"specversion": "1.0", "id": "x", "source": "s", "type": "t",
                       "time": EVENT_TIME}).encode()
    msg = ce_http.HTTPMessage(headers={"content-type": "application/cloudevents+json"}, body=body)
    return ce_http.from_structured(msg, r.JSON_FORMAT).get_attributes()["time"]


class Poster:
    """POSTs every event once, in batches, from a few threads; a stream's
    events by one thread, in order. A batch without a 2xx answer is sent
    again, unchanged."""

    def __init__(self, api, expected, by_stream, workers, batch):
        self.url = f"{api}/v1/events"
        self.lock = threading.Lock()
        self.acked = 0
        self.retried = 0
        self.refused = collections.Counter()  # status (or "no answer") of retried attempts
        self.finished = threading.Event()
        self.error = None
        lanes = [[] for _ in range(workers)]
        for k, stream in enumerate(sorted(by_stream, key=lambda s: int(s[1:]))):
            lanes[k % workers].append(by_stream[stream])
        # Each lane takes its streams' events in the order they were made,
        # which keeps every stream's order.
        self.batches = []
        for lane in lanes:
            ids = sorted((eid for ids in lane for eid in ids), key=lambda x: int(x.rsplit("-", 1)[1]))
            self.batches.append([ids[j:j + batch] for j in range(0, len(ids), batch)])
        self.expected = expected
        self.threads = [threading.Thread(target=self._work, args=(b,), daemon=True)
                        for b in self.batches]

    def start(self):
        for t in self.threads:
            t.start()
        threading.Thread(target=self._join, daemon=True).start()

    def _join(self):
        for t in self.threads:
            t.join()
        self.finished.set()

    def _work(self, batches):
        try:
            for ids in batches:
                body = b"[" + b",".join(self.expected[i].body for i in ids) + b"]"
                while True:
                    try:
                        status, _ = d.http("POST", self.url, body,
                                           "application/cloudevents-batch+json", timeout=30)
                    except (OSError, HTTPException, urllib.error.URLError):
                        status = "no answer"
                    if status in (200, 201):
                        break
                    if status not in ("no answer", 503):
                        raise RunError(f"a batch was answered {status}")
                    with self.lock:
                        self.retried += 1
                        self.refused[status] += 1
                    time.sleep(0.2)
                with self.lock:
                    self.acked += len(ids)
        except Exception as exc:  # reported by the main loop
            self.error = exc


# --------------------------------------------------------------------------
# Checking


def analyse(ledger, expected, by_stream):
    """Figures of one sink from its arrivals, in one pass."""
    position = {eid: k for ids in by_stream.values() for k, eid in enumerate(ids)}
    next_pos = collections.Counter()  # per stream, the first not yet arrived
    arrived = collections.defaultdict(set)  # per stream, positions arrived past it
    res = collections.Counter()
    examples = []
    seen = set()
    for a in ledger.snapshot():
        res["received"] += 1
        if not a.signature_ok:
            res["signature_failures"] += 1
            if len(examples) < 5:
                examples.append(f"{a.id}: {a.problems[:1]}")
            continue
        if a.problems:
            res["content_mismatches"] += 1
            if len(examples) < 5:
                examples.append(f"{a.id}: {a.problems[:2]}")
        if a.id not in expected:
            res["unknown"] += 1
            continue
        if a.id in seen:
            res["redeliveries"] += 1
            continue
        seen.add(a.id)
        stream, pos = expected[a.id].stream, position[a.id]
        if pos != next_pos[stream]:
            res["order_violations"] += 1
            if len(examples) < 5:
                examples.append(f"{a.id} ({stream} #{pos}) arrived before #{next_pos[stream]}")
        arrived[stream].add(pos)
        while next_pos[stream] in arrived[stream]:
            arrived[stream].discard(next_pos[stream])
            next_pos[stream] += 1
    res["unique"] = len(seen)
    res["missing"] = len(expected) - len(seen)
    return res, examples


def fault_points(rng, count, low=0.02, high=0.9):
    """`count` random progress fractions in [low, high), sorted."""
    return sorted(rng.uniform(low, high) for _ in range(count))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--outboxd", required=True, type=Path)
    p.add_argument("--plugins-src", required=True, type=Path, help="built plugins (target/plugins)")
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--kills", type=int, default=100, help="SIGKILLs of outboxd during the run")
    p.add_argument("--broker-restarts", type=int, default=2,
                   help="stop_app/start_app of the run's RabbitMQ node during the run")
    p.add_argument("--streams", type=int, default=100)
    p.add_argument("--batch", type=int, default=100, help="events per POST")
    p.add_argument("--posters", type=int, default=4)
    p.add_argument("--deadline", type=ri.seconds, default=2.0, help="sinks' [limits] deadline")
    p.add_argument("--max-batch", type=int, default=50, help="sinks' [limits] max-batch")
    p.add_argument("--broker-down", type=ri.seconds, default=3.0,
                   help="how long each broker restart keeps it down")
    p.add_argument("--stall", type=ri.seconds, default=120.0,
                   help="fail when nothing progresses for this long")
    p.add_argument("--admin-url", default=os.environ.get("OUTBOXD_E2E_ADMIN_URL", os.environ.get("OUTBOXD_TEST_PG", "postgres://postgres@127.0.0.1:5432/postgres")))
    p.add_argument("--workdir", type=Path, default=REPO_ROOT / "target" / "e2e" / "soak")
    p.add_argument("--seed", type=int, default=None)
    args = p.parse_args(argv)
    if args.events < 1 or args.kills < 0 or args.broker_restarts < 0 or args.streams < 1:
        p.error("--events and --streams must be positive, --kills and --broker-restarts not negative")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    t0 = time.monotonic()

    deadline_ms, lease_ms, tag, dbname, db_url, exchange, secret, work, binary = \
        ri.set_up_run(args, "soak")
    queue_name = exchange

    expected, by_stream = make_events(args.events, args.streams, tag, sdk_time())
    n = len(expected)
    log(t0, f"{n} events over {len(by_stream)} streams; {args.kills} SIGKILLs, "
            f"{args.broker_restarts} broker restarts (seed {seed})")

    admin = d.Psql(args.admin_url)
    db = d.Psql(db_url)
    ledgers = {s: r.Ledger(s, expected) for s in SINKS}
    broker = webhook = amqp = daemon = None
    created_db = False
    try:
        broker = Broker(tag)
        broker.start()
        log(t0, f"RabbitMQ node {broker.node} on 127.0.0.1:{broker.port}")
        admin.query(f'CREATE DATABASE "{dbname}"')
        created_db = True
        r.declare_amqp(broker.url, exchange, queue_name)
        webhook = r.WebhookReceiver(ledgers["webhook"], secret)
        # A request cut off by a SIGKILL is expected here a hundred times:
        # no traceback for each.
        webhook.server.handle_error = lambda request, client_address: None
        webhook.start()
        amqp = r.AmqpConsumer(ledgers["amqp"], broker.url, queue_name)
        amqp.start()

        port = d.free_port()
        env = d.sinks_env(db_url, work, port, lease_ms, webhook.url, secret, broker.url, exchange)
        env.setdefault("RUST_LOG", "warn")
        daemon = d.Daemon(binary, env, port, work)
        daemon.start()
        up_since = time.monotonic()
        log(t0, f"outboxd ready on {daemon.api}; database {dbname}; lease {lease_ms} ms")

        poster = Poster(daemon.api, expected, by_stream, args.posters, args.batch)
        poster.start()

        def progress():
            got = sum(len(ledgers[s].unique) for s in SINKS)
            return (poster.acked + got) / (3 * n)

        faults = [(x, "kill") for x in fault_points(rng, args.kills)]
        faults += [(x, "broker") for x in fault_points(rng, args.broker_restarts, 0.1, 0.8)]
        faults.sort()
        kills = broker_restarts = 0
        last_progress, last_change = -1.0, time.monotonic()

        def watch():
            nonlocal last_progress, last_change
            if poster.error:
                raise RunError(f"posting failed: {poster.error}")
            now_p = progress()
            if now_p > last_progress:
                last_progress, last_change = now_p, time.monotonic()
            elif time.monotonic() - last_change > args.stall:
                raise RunError(f"no progress for {args.stall:.0f}s at {now_p:.1%}")
            return now_p

        for point, kind in faults:
            while watch() < point or time.monotonic() - up_since < 0.5:
                time.sleep(0.02)
            if kind == "kill":
                daemon.kill()
                kills += 1
                time.sleep(rng.uniform(0.05, 0.5))
                daemon.start(timeout=120)
                up_since = time.monotonic()
                if kills % max(1, args.kills // 10) == 0 or kills == args.kills:
                    log(t0, f"SIGKILL {kills}/{args.kills} at {point:.1%}: acknowledged "
                            f"{poster.acked}, unique webhook {len(ledgers['webhook'].unique)}, "
                            f"amqp {len(ledgers['amqp'].unique)}")
            else:
                broker.restart(args.broker_down)
                broker_restarts += 1
                log(t0, f"broker restart {broker_restarts}/{args.broker_restarts} at {point:.1%} "
                        f"({args.broker_down:.1f}s down)")

        # Drain: every event at both receivers, nothing live in the database.
        def live():
            rows = db.query("SELECT count(*) FROM outboxd.deliveries WHERE status <> 'delivered'")
            return int(rows[0][0])
        while True:
            watch()
            if poster.finished.is_set() and all(len(ledgers[s].unique) >= n for s in SINKS) \
                    and live() == 0:
                break
            time.sleep(0.5)
        time.sleep(1.0)  # late re-deliveries show up too
        daemon.stop()
        elapsed = time.monotonic() - t0

        # ------------------------------------------------------------------
        failed = False
        results = {s: analyse(ledgers[s], expected, by_stream) for s in SINKS}
        dead = int(db.query("SELECT count(*) FROM outboxd.deliveries WHERE status = 'dead'")[0][0])
        print(f"\nsoak: {n} events over {len(by_stream)} streams, {kills} x SIGKILL + restart, "
              f"{broker_restarts} broker restarts; {poster.retried} POSTs sent again "
              f"({dict(poster.refused)}); {dead} dead letters; {elapsed:.1f}s (seed {seed})")
        print(f"{'':28}{'webhook':>10}{'amqp':>10}")
        for key in ("received", "unique", "redeliveries", "order_violations", "missing",
                    "content_mismatches", "signature_failures", "unknown"):
            print(f"  {key.replace('_', ' '):26}" + "".join(f"{results[s][0][key]:>10}" for s in SINKS))
        for s in SINKS:
            res, examples = results[s]
            bad = res["missing"] or res["order_violations"] or res["content_mismatches"] \
                or res["signature_failures"] or res["unknown"]
            if bad:
                failed = True
                print(f"  {s}: " + "; ".join(examples))
        if dead:
            failed = True
        print("RESULT " + ("FAIL" if failed else "PASS"), flush=True)
        return 1 if failed else 0
    except RunError as exc:
        log(t0, f"RESULT FAIL: {exc}")
        return 1
    finally:
        if daemon is not None and daemon.alive():
            daemon.stop()
        for part in (amqp, webhook):
            if part is not None:
                part.stop()
        if created_db:
            try:
                admin.query(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
            except RuntimeError as exc:
                print(f"dropping {dbname}: {exc}", flush=True)
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    sys.exit(main())

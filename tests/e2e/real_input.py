#!/usr/bin/env python3
"""End to end on real input, with real clients, through crashes.

Run by tests/e2e/real_input.sh (which creates the virtual environment and
builds outboxd and its plugins); by hand:

    target/e2e-venv/bin/python tests/e2e/real_input.py \\
        --outboxd target/debug/outboxd --plugins-src target/plugins [--cases DIR]

1. outboxd runs on a fresh PostgreSQL database with two sinks in a plugins
   folder of its own (target/e2e/run/plugins): `webhook`, to a receiver on
   127.0.0.1, and `amqp`, to a topic exchange declared on the local RabbitMQ
   with a queue bound `#`. No routes: every event goes to both sinks. The
   shipped manifests are copied with a short `[limits] deadline`, and the
   lease is set to the least the daemon accepts (2 x deadline + 5 s), so that
   deliveries leased by a killed process are taken over quickly.
2. Every payload of the cases folder becomes an event built with the
   CloudEvents SDK (tests/e2e/events.py), plus A -> B -> A on a few streams.
   Each event is POSTed twice, the second time it must be answered as a
   duplicate (HTTP 200, duplicate: true, the same sequence). A POST that gets
   no answer (outboxd down or killed mid-request) is sent again until it is
   answered.
3. The webhook receiver verifies every request with `standardwebhooks` and
   parses it with the SDK's HTTP binding; RabbitMQ is consumed with `pika`
   (tests/e2e/receivers.py).
4. outboxd is killed with SIGKILL (--kills times, at least 5) while events are
   being posted and delivered, and restarted on the same database and port
   (see the kill loop in `main` for when exactly). The POSTs are spread over
   --post-seconds, so the first kills fall during ingest; each process must
   have delivered some events before it is killed, so every kill also falls
   in the middle of deliveries (the report shows how many arrived in the
   second before each kill and how many were leased).
5. The report: events sent, stored, duplicates answered; for each sink the
   events received, unique ids, re-deliveries, order violations, missing
   events, signature failures and content mismatches; outboxd's /metrics
   against what the receivers saw. Exit status 1 if any check fails.

Order: an event's first arrival at a sink is an order violation when an
earlier event of its stream (by the sequence outboxd answered at ingest) has
not arrived at that sink yet. A repeat of an id already seen is a
re-delivery (at least once), never a violation.

Metrics across restarts: counters start from zero in every process, so the
run sums them over all processes. Right before each SIGKILL the run takes
SHARE locks on outboxd.events and outboxd.deliveries (tests/e2e/daemon.py,
`Freeze`): outboxd keeps running and delivering, but can commit no ingest,
claim or delivery outcome until the kill; after a short pause (so that the
counter of any commit that completed before the lock is incremented) /metrics
is scraped, then the process is killed with its pending commits, and the
locks are released. Every counted outcome is then in exactly one scrape,
which makes the comparison exact: summed over the processes,
outboxd_deliveries_total{outcome="delivered"} of a sink must equal the
number of events (each delivery is finished once, fenced by its lease), lie
between the unique ids the receiver saw and all it received including
re-deliveries, and outboxd_events_ingested_total{outcome="stored"} must equal
the events stored. (Comparing against the last process alone would check
only what happened after the last crash.)
"""

import argparse
import base64
import collections
import json
import os
import random
import re
import shutil
import sys
import threading
import time
import tomllib
import urllib.error
import uuid
from http.client import HTTPException
from pathlib import Path

import daemon as d
import events as e
import receivers as r

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CASES = REPO_ROOT / "tests" / "cases" / "github-webhooks"
SINKS = ("webhook", "amqp")


class RunError(Exception):
    pass


def log(t0, msg):
    print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)


# --------------------------------------------------------------------------
# Set-up


def seconds(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: write e.g. 3s or 2500ms")
    return float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)


def prepare_plugins(src, dst, deadline, max_batch):
    """Copy the shipped webhook and amqp sinks with `[limits] deadline` and
    `max-batch` set."""
    dst.mkdir(parents=True)
    for name in SINKS:
        for suffix in (".wasm", ".toml"):
            if not (src / f"{name}{suffix}").is_file():
                raise RunError(f"{src / (name + suffix)} missing: run scripts/build-plugins.sh")
        shutil.copy(src / f"{name}.wasm", dst / f"{name}.wasm")
        text = (src / f"{name}.toml").read_text()
        text, n = re.subn(r'(?m)^deadline\s*=\s*"[^"]*"', f'deadline = "{deadline}"', text)
        text, m = re.subn(r'(?m)^max-batch\s*=\s*\d+', f'max-batch = {max_batch}', text)
        limits = tomllib.loads(text).get("limits", {})
        if n != 1 or m != 1 or limits.get("deadline") != deadline or limits.get("max-batch") != max_batch:
            raise RunError(f"{name}.toml: could not set [limits] deadline and max-batch")
        (dst / f"{name}.toml").write_text(text)


# --------------------------------------------------------------------------
# Producing


class Poster:
    """POSTs every event twice from a few threads; a stream's events are posted
    by one thread, in order, so its sequences follow the send order."""

    def __init__(self, api, per_stream, workers, deadline, seconds):
        self.url = f"{api}/v1/events"
        self.deadline = deadline
        self.seconds = seconds  # spread the POSTs over this long
        self.started = None
        self.issued = 0
        self.lock = threading.Lock()
        self.total_posts = 2 * sum(len(v) for v in per_stream.values())
        self.done_posts = 0
        self.failed_attempts = 0
        self.stored = 0  # first send answered 201
        self.stored_lost_answer = 0  # first send answered as duplicate after an attempt without answer
        self.duplicates = 0  # second send answered 200, duplicate: true, same sequence
        self.errors = []
        self.finished = threading.Event()
        groups = [[] for _ in range(workers)]
        for stream in sorted(per_stream, key=lambda s: -len(per_stream[s])):
            min(groups, key=lambda g: sum(len(per_stream[s]) for s in g)).append(stream)
        self.groups = [[per_stream[s] for s in g] for g in groups if g]
        self.threads = [threading.Thread(target=self._work, args=(g,), daemon=True) for g in self.groups]

    def start(self):
        self.started = time.monotonic()
        for t in self.threads:
            t.start()
        threading.Thread(target=self._join, daemon=True).start()

    def _join(self):
        for t in self.threads:
            t.join()
        self.finished_at = time.monotonic()
        self.finished.set()

    def _post(self, body, content_type):
        """(status, answer, attempts): sent again until outboxd answers."""
        attempts = 0
        while True:
            attempts += 1
            try:
                status, resp = d.http("POST", self.url, body, content_type, timeout=20)
                if status < 500:
                    with self.lock:
                        self.done_posts += 1
                    try:
                        return status, json.loads(resp), attempts
                    except ValueError:
                        return status, {"raw": resp[:300].decode("utf-8", "replace")}, attempts
            except (OSError, HTTPException, urllib.error.URLError):
                pass
            with self.lock:
                self.failed_attempts += 1
            if time.monotonic() > self.deadline:
                raise RunError("a POST got no answer before the run's deadline")
            time.sleep(0.1)

    def _pace(self):
        """Wait for this POST's slot: an even rate over `seconds`."""
        with self.lock:
            slot = self.started + self.seconds * self.issued / self.total_posts
            self.issued += 1
        delay = slot - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def _send(self, ev):
        self._pace()
        status, answer, attempts = self._post(ev.body, ev.content_type)
        ok_ids = answer.get("id") == ev.id and answer.get("stream") == ev.stream
        if status == 201 and answer.get("duplicate") is False and ok_ids:
            with self.lock:
                self.stored += 1
        elif status == 200 and answer.get("duplicate") is True and ok_ids and attempts > 1:
            with self.lock:
                self.stored_lost_answer += 1
        else:
            self.errors.append(f"{ev.label}: first send answered {status} {answer}")
            return
        ev.sequence = answer.get("sequence")
        self._pace()
        status, answer, _ = self._post(ev.body, ev.content_type)
        if (status == 200 and answer.get("duplicate") is True and answer.get("id") == ev.id
                and answer.get("sequence") == ev.sequence):
            with self.lock:
                self.duplicates += 1
        else:
            self.errors.append(f"{ev.label}: second send answered {status} {answer}, not a duplicate")

    def _work(self, streams):
        try:
            # Round robin over this thread's streams, each in its own order.
            queues = [collections.deque(evs) for evs in streams]
            while queues:
                for q in list(queues):
                    self._send(q.popleft())
                    if not q:
                        queues.remove(q)
        except RunError as exc:
            self.errors.append(str(exc))


# --------------------------------------------------------------------------
# Checking


def analyse(ledger, expected, abas):
    """Figures of one sink from its arrivals."""
    by_stream = collections.defaultdict(list)
    for ev in expected.values():
        if ev.sequence is not None:
            by_stream[ev.stream].append((ev.sequence, ev.id))
    for v in by_stream.values():
        v.sort()
    arrivals = ledger.snapshot()
    seen, first_pos = set(), {}
    res = collections.Counter()
    examples = collections.defaultdict(list)
    for a in arrivals:
        res["received"] += 1
        if not a.signature_ok:
            res["signature_failures"] += 1
            examples["signature"].append(a.problems[:1])
            continue
        if a.problems:
            res["content_mismatches"] += 1
            examples["content"].append((a.id, a.problems[:3]))
        if a.id not in expected:
            res["unknown"] += 1
            continue
        if a.id in seen:
            res["redeliveries"] += 1
            continue
        seen.add(a.id)
        first_pos[a.id] = len(first_pos)
        ev = expected[a.id]
        if ev.sequence is None:
            continue
        if a.sequence != ev.sequence:
            res["sequence_mismatches"] += 1
        before = [i for seq, i in by_stream[ev.stream] if seq < ev.sequence and i not in seen]
        if before:
            res["order_violations"] += 1
            examples["order"].append(f"{ev.stream} seq {ev.sequence} arrived before "
                                     f"{len(before)} earlier event(s) of its stream")
    res["unique"] = len(seen)
    res["missing"] = len(expected.keys() - seen)
    res["aba_ok"] = sum(
        1 for _, ids in abas
        if all(i in first_pos for i in ids) and first_pos[ids[0]] < first_pos[ids[1]] < first_pos[ids[2]])
    return res, examples


def dump(work, expected, ledgers, kills):
    """events.jsonl, arrivals.SINK.jsonl and kills.json in the run folder."""
    with open(work / "events.jsonl", "w") as fh:
        for ev in expected.values():
            fh.write(json.dumps({"id": ev.id, "stream": ev.stream, "sequence": ev.sequence,
                                 "type": ev.type, "label": ev.label}) + "\n")
    for sink, ledger in ledgers.items():
        with open(work / f"arrivals.{sink}.jsonl", "w") as fh:
            for a in ledger.snapshot():
                fh.write(json.dumps(a.__dict__) + "\n")
    (work / "kills.json").write_text(json.dumps(kills, indent=1, default=str))


def set_up_run(args, kind):
    """What a run against outboxd starts from: the sinks' deadline (ms), the
    least lease the daemon accepts for it (2 x deadline + 5 s), a random
    tag, the names of a PostgreSQL database and an AMQP exchange (= queue)
    of the run's own (`outboxd_KIND_TAG`, `outboxd-KIND-TAG`), a webhook
    secret, and a fresh work folder `args.workdir` holding a copy of the
    binary (so every restart runs the same build) and the plugins folder."""
    deadline_ms = int(round(args.deadline * 1000))
    lease_ms = 2 * deadline_ms + 5000
    tag = uuid.uuid4().hex[:8]
    dbname = f"outboxd_{kind}_{tag}"
    db_url = args.admin_url.rsplit("/", 1)[0] + f"/{dbname}"
    exchange = f"outboxd-{kind}-{tag}"
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    work = args.workdir
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    binary = work / "outboxd"
    shutil.copy(args.outboxd, binary)
    prepare_plugins(args.plugins_src, work / "plugins", f"{deadline_ms}ms", args.max_batch)
    return deadline_ms, lease_ms, tag, dbname, db_url, exchange, secret, work, binary


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--outboxd", required=True, type=Path)
    p.add_argument("--plugins-src", required=True, type=Path, help="built plugins (target/plugins)")
    p.add_argument("--cases", type=Path, default=DEFAULT_CASES)
    p.add_argument("--kills", type=int, default=6, help="SIGKILLs during the run (at least 5)")
    p.add_argument("--aba-streams", type=int, default=3)
    p.add_argument("--posters", type=int, default=4)
    p.add_argument("--deadline", type=seconds, default=2.0, help="sinks' [limits] deadline")
    p.add_argument("--post-seconds", type=seconds, default=12.0,
                   help="spread the POSTs evenly over this long")
    p.add_argument("--kill-after", type=int, default=15,
                   help="first arrivals since a start before that process may be killed")
    p.add_argument("--max-batch", type=int, default=20,
                   help="sinks' [limits] max-batch: a batch must finish within the deadline")
    p.add_argument("--webhook-delay", type=seconds, default=0.005, help="receiver's pause per request")
    p.add_argument("--timeout", type=seconds, default=240.0, help="the whole run, after the build")
    p.add_argument("--admin-url", default=os.environ.get("OUTBOXD_E2E_ADMIN_URL", os.environ.get("OUTBOXD_TEST_PG", "postgres://postgres@127.0.0.1:5432/postgres")))
    p.add_argument("--amqp-url", default=os.environ.get("OUTBOXD_E2E_AMQP_URL", os.environ.get("OUTBOXD_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2f")))
    p.add_argument("--workdir", type=Path, default=REPO_ROOT / "target" / "e2e" / "run")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--keep", action="store_true", help="keep the database, exchange and queue")
    args = p.parse_args(argv)
    if args.kills < 5:
        p.error("--kills must be at least 5")
    if not args.cases.is_dir():
        p.error(f"--cases {args.cases}: no such folder")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    t0 = time.monotonic()
    deadline = t0 + args.timeout

    deadline_ms, lease_ms, tag, dbname, db_url, exchange, secret, work, binary = \
        set_up_run(args, "e2e")
    queue_name = exchange

    per_stream, abas = e.build(args.cases, args.aba_streams)
    expected = {ev.id: ev for evs in per_stream.values() for ev in evs}
    n_events = len(expected)
    n_payloads = n_events - 3 * len(abas)
    log(t0, f"{n_payloads} payloads from {args.cases} over {len(per_stream)} streams, "
            f"+ A->B->A on {len(abas)} streams = {n_events} events, each sent twice (seed {seed})")

    admin = d.Psql(args.admin_url)
    db = d.Psql(db_url)
    ledgers = {s: r.Ledger(s, expected) for s in SINKS}
    webhook = amqp = daemon = None
    created_db = declared = False
    checks = []
    report = {}
    try:
        admin.query(f'CREATE DATABASE "{dbname}"')
        created_db = True
        r.declare_amqp(args.amqp_url, exchange, queue_name)
        declared = True
        webhook = r.WebhookReceiver(ledgers["webhook"], secret, args.webhook_delay)
        webhook.start()
        amqp = r.AmqpConsumer(ledgers["amqp"], args.amqp_url, queue_name)
        amqp.start()

        port = d.free_port()
        env = d.sinks_env(db_url, work, port, lease_ms, webhook.url, secret, args.amqp_url, exchange)
        env.setdefault("RUST_LOG", "info")
        log(t0, f"database {dbname}, exchange/queue {exchange}, webhook receiver {webhook.url}, "
                f"deadline {deadline_ms} ms, lease {lease_ms} ms")
        daemon = d.Daemon(binary, env, port, work)
        daemon.start()
        ready_at = time.monotonic()
        log(t0, f"outboxd ready on {daemon.api}")

        poster = Poster(daemon.api, per_stream, args.posters, deadline, args.post_seconds)
        poster.start()

        # Kill i waits until (a) the POSTs are past the i-th of kills+1 equal
        # parts (or all answered) and (b) this process is delivering: at
        # least --kill-after events arrived for the first time since it
        # started (or everything posted so far has arrived, or it has run
        # for a lease + 5 s). So every process both ingests and delivers
        # before it is killed, in the middle of that work.
        scrapes = []  # one per process: (samples, exact)
        kills = []
        thresholds = [poster.total_posts * (i + 1) / (args.kills + 1) for i in range(args.kills)]
        for i, threshold in enumerate(thresholds):
            at_start = sum(ledgers[s].unique_count() for s in SINKS)
            while True:
                if time.monotonic() > deadline:
                    raise RunError("the run did not progress before the deadline")
                uptime = time.monotonic() - ready_at
                posted_enough = poster.done_posts >= threshold or poster.finished.is_set()
                got_now = {s: ledgers[s].unique_count() for s in SINKS}
                delivering = (sum(got_now.values()) - at_start >= args.kill_after
                              or all(v >= poster.stored + poster.stored_lost_answer for v in got_now.values())
                              or uptime >= lease_ms / 1000 + 5)
                if posted_enough and delivering and uptime >= 0.3:
                    break
                time.sleep(0.01)
            freeze = d.Freeze(db_url)
            try:
                if freeze.ok:
                    time.sleep(0.3)  # counters of commits made before the lock
                try:
                    samples = daemon.scrape()
                except (OSError, RuntimeError, urllib.error.URLError) as exc:
                    samples = None
                    checks.append((False, f"/metrics scrape before kill {i + 1}: {exc}"))
                posted = poster.done_posts
                got = {s: ledgers[s].unique_count() for s in SINKS}
                now = time.time()
                recent = {s: sum(1 for a in ledgers[s].snapshot() if a.at > now - 1.0) for s in SINKS}
                daemon.kill()
            finally:
                freeze.release()
            leased = d.metric(samples, "outboxd_queue_depth", status="leased") if samples else float("nan")
            scrapes.append((samples, freeze.ok))
            kills.append(dict(posted=posted, got=got, recent=recent, leased=leased,
                              frozen=freeze.ok, error=freeze.error))
            log(t0, f"SIGKILL {i + 1}/{args.kills}: posts answered {posted}/{poster.total_posts}; "
                    f"unique received webhook {got['webhook']}, amqp {got['amqp']}; "
                    f"arrivals in the last second {recent['webhook']} + {recent['amqp']}; "
                    f"deliveries leased {leased:.0f}"
                    + ("" if freeze.ok else f" (no freeze: {freeze.error})"))
            time.sleep(rng.uniform(0.1, 1.0))  # down for a moment: POSTs fail and are retried
            daemon.start()
            ready_at = time.monotonic()
            log(t0, f"outboxd restarted ({daemon.incarnation})")

        while not poster.finished.is_set():
            if time.monotonic() > deadline:
                raise RunError("posting did not finish before the deadline")
            time.sleep(0.05)
        log(t0, f"all {poster.done_posts} POSTs had been answered at {poster.finished_at - t0:.1f}s; "
                f"{poster.failed_attempts} attempts without answer were sent again")

        # Drain: every event at both receivers, nothing pending in the database.
        def pending():
            return sum(int(c) for _, st, c in db.query(
                "SELECT sink, status, count(*) FROM outboxd.deliveries GROUP BY 1, 2") if st != "delivered")
        while True:
            got = {s: ledgers[s].unique_count() for s in SINKS}
            if all(v == n_events for v in got.values()) and pending() == 0:
                break
            if time.monotonic() > deadline or not daemon.alive():
                log(t0, f"drain incomplete: received {got}, pending {pending()}")
                break
            time.sleep(0.25)
        time.sleep(1.0)  # late re-deliveries show up too
        scrapes.append((daemon.scrape(), True))
        exit_status = daemon.stop()
        log(t0, f"outboxd stopped with SIGTERM (exit status {exit_status})")
        elapsed = time.monotonic() - t0

        # ------------------------------------------------------------------
        stored_rows = int(db.query("SELECT count(*) FROM outboxd.events")[0][0])
        by_status = collections.Counter()
        for sink, status, count in db.query(
                "SELECT sink, status, count(*) FROM outboxd.deliveries GROUP BY 1, 2"):
            by_status[(sink, status)] += int(count)

        dump(work, expected, ledgers, kills)
        exact = all(ok and s is not None for s, ok in scrapes)
        def msum(name, **labels):
            return sum(d.metric(s, name, **labels) for s, _ in scrapes if s is not None)

        sink_res = {s: analyse(ledgers[s], expected, abas) for s in SINKS}
        N = n_events
        P = poster

        print()
        print("=" * 72)
        print("outboxd end to end on real input")
        print("=" * 72)
        print(f"cases        {args.cases} ({n_payloads} payloads, {len(per_stream)} streams)")
        print(f"events       {N} = {n_payloads} payloads + A->B->A on {len(abas)} streams "
              f"({', '.join(s for s, _ in abas)})")
        print(f"crashes      {len(kills)} x SIGKILL + restart, same database and port "
              f"({daemon.incarnation} processes)")
        print("             at each kill: POSTs answered / arrivals at the sinks in the last second / "
              "deliveries leased")
        print("             " + ", ".join(f"{k['posted']}/{sum(k['recent'].values())}/{k['leased']:.0f}"
                                         for k in kills))
        print()
        print("ingest")
        print(f"  events sent                {N} (each twice: {P.total_posts} POSTs answered; "
              f"{P.failed_attempts} attempts without answer, sent again)")
        print(f"  stored                     {P.stored + P.stored_lost_answer} "
              f"({P.stored} answered 201, {P.stored_lost_answer} answered duplicate after a lost answer); "
              f"{stored_rows} rows in outboxd.events")
        print(f"  duplicates answered        {P.duplicates} of {N} second sends (200, duplicate: true, same sequence)")
        print(f"  other answers              {len(P.errors)}")
        for err in P.errors[:5]:
            print(f"    {err}")
        checks.append((P.stored + P.stored_lost_answer == N and stored_rows == N and not P.errors,
                       f"every event stored once ({stored_rows} rows for {N} events), no other answers"))
        checks.append((P.duplicates == N, f"every second send a duplicate success ({P.duplicates}/{N})"))

        print()
        rows = [
            ("events received (incl. re-deliveries)", "received"),
            ("unique ids", "unique"),
            ("re-deliveries", "redeliveries"),
            ("per-stream order violations", "order_violations"),
            ("missing events", "missing"),
            ("signature failures", "signature_failures"),
            ("content mismatches (data, attributes)", "content_mismatches"),
            ("sequence differs from ingest answer", "sequence_mismatches"),
            (f"A->B->A in order (of {len(abas)})", "aba_ok"),
        ]
        print(f"{'sinks':<40}{'webhook':>12}{'amqp':>12}")
        for title, key in rows:
            vals = []
            for s in SINKS:
                if key == "signature_failures" and s == "amqp":
                    vals.append("n/a")
                else:
                    vals.append(str(sink_res[s][0][key]))
            print(f"  {title:<38}{vals[0]:>12}{vals[1]:>12}")
        db_cells = [f"{by_status[(s, 'delivered')]}/"
                    f"{sum(v for (k, st), v in by_status.items() if k == s and st != 'delivered')}"
                    for s in SINKS]
        print(f"  {'outboxd.deliveries delivered/other':<38}{db_cells[0]:>12}{db_cells[1]:>12}")
        for s in SINKS:
            res, ex = sink_res[s]
            checks.append((res["missing"] == 0 and res["unique"] == N, f"{s}: no event missing ({res['unique']}/{N} unique)"))
            checks.append((res["order_violations"] == 0, f"{s}: no order violation"))
            if s == "webhook":  # AMQP messages carry no signature
                checks.append((res["signature_failures"] == 0, f"{s}: every request's signature verified"))
            checks.append((res["content_mismatches"] == 0 and res["unknown"] == 0 and res["sequence_mismatches"] == 0,
                           f"{s}: data byte for byte and attributes as sent"))
            checks.append((res["aba_ok"] == len(abas), f"{s}: A->B->A arrived as three events in order"))
            checks.append((by_status[(s, "delivered")] == N, f"{s}: all {N} deliveries marked delivered in the database"))
            for kind, items in ex.items():
                for item in items[:3]:
                    print(f"    {s} {kind}: {item}")

        print()
        print(f"metrics (summed over the {len(scrapes)} processes; each scraped right before its SIGKILL "
              f"with commits held back{'' if exact else ' - NOT ALL EXACT'}, the last at the end)")
        print(f"{'':<40}{'webhook':>12}{'amqp':>12}")
        for outcome in ("delivered", "retry", "released", "lease_lost", "dead"):
            vals = [msum("outboxd_deliveries_total", sink=s, outcome=outcome) for s in SINKS]
            print(f"  {'deliveries_total{' + outcome + '}':<38}{vals[0]:>12.0f}{vals[1]:>12.0f}")
        traps = [msum("outboxd_plugin_traps_total", plugin=s) for s in SINKS]
        print(f"  {'plugin_traps_total':<38}{traps[0]:>12.0f}{traps[1]:>12.0f}")
        for s in SINKS:
            res = sink_res[s][0]
            delivered = msum("outboxd_deliveries_total", sink=s, outcome="delivered")
            checks.append((res["unique"] <= delivered <= res["received"],
                           f"{s}: metrics delivered {delivered:.0f} between unique {res['unique']} "
                           f"and received {res['received']}"))
            if exact:
                checks.append((delivered == N, f"{s}: metrics delivered {delivered:.0f} = {N} events (exact)"))
            dead = msum("outboxd_deliveries_total", sink=s, outcome="dead")
            checks.append((dead == 0, f"{s}: no dead letters counted ({dead:.0f})"))
        ing = {o: msum("outboxd_events_ingested_total", outcome=o) for o in ("stored", "duplicate", "conflict", "rejected")}
        print(f"  events_ingested_total          stored {ing['stored']:.0f}, duplicate {ing['duplicate']:.0f}, "
              f"conflict {ing['conflict']:.0f}, rejected {ing['rejected']:.0f}")
        answered_dups = P.duplicates + P.stored_lost_answer
        if exact:
            checks.append((ing["stored"] == stored_rows == N,
                           f"metrics stored {ing['stored']:.0f} = {stored_rows} rows (exact)"))
        checks.append((ing["duplicate"] >= answered_dups,
                       f"metrics duplicate {ing['duplicate']:.0f} >= {answered_dups} duplicates answered"))
        checks.append((ing["conflict"] == 0 and ing["rejected"] == 0, "metrics: no conflict, no rejection"))
        checks.append((len(kills) >= 5, f"{len(kills)} SIGKILLs (at least 5)"))
        checks.append((exit_status == 0, f"outboxd stopped cleanly at the end (exit {exit_status})"))
        if amqp.errors:  # e.g. a broker restart by someone else: the consumer reconnects
            print(f"note: the pika consumer reconnected {len(amqp.errors)} time(s): {amqp.errors[0]}")

        print()
        failed = [c for c in checks if not c[0]]
        for ok, text in checks:
            print(f"  {'ok  ' if ok else 'FAIL'}  {text}")
        print()
        print(f"runtime      {elapsed:.1f}s (after the build)")
        report["ok"] = not failed
        print("RESULT       " + ("PASS" if not failed else f"FAIL ({len(failed)} checks)"))
    except (RunError, RuntimeError, e.CasesError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        report["ok"] = False
    finally:
        if daemon is not None and daemon.alive():
            daemon.stop()
        if amqp is not None:
            amqp.stop()
        if webhook is not None:
            webhook.stop()
        if not args.keep:
            if declared:
                try:
                    r.delete_amqp(args.amqp_url, exchange, queue_name)
                except Exception as exc:
                    print(f"warning: could not delete exchange/queue {exchange}: {exc}", file=sys.stderr)
            if created_db:
                try:
                    admin.query(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
                except RuntimeError as exc:
                    print(f"warning: {exc}", file=sys.stderr)
        else:
            print(f"kept database {dbname}, exchange and queue {exchange}", file=sys.stderr)
        if not report.get("ok") and daemon is not None and daemon.log_path:
            print(f"logs in {work} (last: {daemon.log_path})", file=sys.stderr)
    return 0 if report.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())

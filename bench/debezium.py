"""The `debezium` stage of the benchmark: the in-transaction outbox path,
Debezium against outboxd, in the same run, against the same receiver.

Owns: a private PostgreSQL cluster with `wal_level = logical` (initdb/pg_ctl
on a free port, data under .bench/run/, stopped at the end), Debezium Server
3.6.1.Final with its HTTP sink (downloaded from Maven Central into
.bench/debezium-server; it needs Java 21 or later) or, when no such Java is
found, the Debezium Engine peer (bench/peers/debezium, Java 17, built into
.bench/debezium), one outboxd
process with the webhook sink, and the load generator
(bench/rust/examples/outbox_load.rs) that writes the same N application
transactions for both sides. Returns one dict per side and their ratio.

Must never touch the shared PostgreSQL on 5432 (everything here runs on the
private cluster) and never leave its cluster or processes running: every
process it starts is ended by id in a `finally`.
"""

import json
import os
import shutil
import subprocess
import time

PG_BIN = "/usr/lib/postgresql/15/bin"
SERVER_DIST = ("https://repo1.maven.org/maven2/io/debezium/debezium-server-dist/3.6.1.Final/"
               "debezium-server-dist-3.6.1.Final.tar.gz")
CONNECTIONS = 4


def _as_pg(cmd):
    """As root, the server tools run as the `postgres` user (they refuse root)."""
    return ["runuser", "-u", "postgres", "--"] + cmd if os.geteuid() == 0 else cmd


class PrivateCluster:
    """A PostgreSQL 15 cluster of this stage's own, `wal_level = logical`."""

    def __init__(self, h):
        self.h = h
        self.dir = os.path.join(h.RUN, "debezium-pg")
        self.data = os.path.join(self.dir, "data")
        self.port = h.free_port()

    def start(self):
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        if os.geteuid() == 0:
            subprocess.run(["chown", "postgres:postgres", self.dir], check=True)
        self.h.sh(_as_pg([os.path.join(PG_BIN, "initdb"), "-D", self.data, "-A", "trust", "-U", "postgres",
                          "--no-sync"]), stdout=subprocess.DEVNULL)
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.dir} "
                "-c wal_level=logical -c max_wal_senders=10 -c max_replication_slots=10 "
                "-c max_connections=200 -c fsync=off -c synchronous_commit=on")
        self.h.sh(_as_pg([os.path.join(PG_BIN, "pg_ctl"), "-D", self.data, "-o", opts, "-w",
                          "-l", os.path.join(self.dir, "log"), "start"]), stdout=subprocess.DEVNULL)

    def stop(self):
        subprocess.run(_as_pg([os.path.join(PG_BIN, "pg_ctl"), "-D", self.data, "-m", "fast", "-w", "stop"]),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def url(self, db="postgres"):
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"

    def psql(self, sql, db="postgres"):
        out = subprocess.run(["psql", self.url(db), "-qAtX", "-c", sql], check=True, capture_output=True,
                             text=True)
        return out.stdout.strip()


def server_probe():
    """HTTP status of the Debezium Server distribution on Maven Central (a HEAD)."""
    try:
        out = subprocess.run(["curl", "-sSI", "-o", "/dev/null", "-w", "%{http_code} %header{content-length}",
                              "--max-time", "20", SERVER_DIST], capture_output=True, text=True)
        return out.stdout.strip() or out.stderr.strip()
    except OSError as e:
        return str(e)


def peer_jar(h):
    """The Debezium Engine peer's jar with dependencies, built on first use."""
    jar = os.path.join(h.WORK, "debezium", "target", "debezium-peer.jar")
    src = os.path.join(h.BENCH, "peers", "debezium")
    newest = max(os.path.getmtime(os.path.join(d, f)) for d, _, fs in os.walk(src) for f in fs)
    if not os.path.exists(jar) or os.path.getmtime(jar) < newest:
        h.sh(["mvn", "-q", "-B", "package", "-DskipTests"], cwd=src)
    return jar


def java21():
    """A `java` of version 21 or later (Debezium Server 3.6 is built for 21), or None."""
    cands = [os.environ.get("DEBEZIUM_JAVA", "")]
    for d in sorted(os.listdir("/usr/lib/jvm")) if os.path.isdir("/usr/lib/jvm") else []:
        cands.append(os.path.join("/usr/lib/jvm", d, "bin", "java"))
    cands.append(shutil.which("java") or "")
    for j in cands:
        if not j or not os.path.exists(j):
            continue
        out = subprocess.run([j, "-XshowSettings:properties", "-version"], capture_output=True, text=True)
        for line in out.stderr.splitlines():
            if "java.specification.version" in line:
                try:
                    if int(line.split("=")[1].strip()) >= 21:
                        return j
                except ValueError:
                    pass
    return None


def server_dir(h):
    """Debezium Server unpacked under .bench/debezium-server (downloaded once)."""
    d = os.path.join(h.WORK, "debezium-server")
    if not os.path.exists(os.path.join(d, "run.sh")):
        tgz = os.path.join(h.WORK, "dbz-server.tar.gz")
        if not os.path.exists(tgz):
            h.sh(["curl", "-sSfL", "-o", tgz + ".part", SERVER_DIST])
            os.rename(tgz + ".part", tgz)
        h.sh(["tar", "xzf", tgz, "-C", h.WORK])
    return d


def server_config(ctx, pg, db, offsets):
    """application.properties of the Debezium Server run: pgoutput, the outbox
    EventRouter, HTTP sink with `ce-` headers (id, partitionkey, sequence)."""
    return f"""debezium.sink.type=http
debezium.sink.http.url={ctx.receiver_url}/debezium
debezium.sink.http.headers.prefix=ce-
debezium.sink.http.headers.encode.base64=false
debezium.sink.http.timeout.ms=30000
debezium.sink.http.retries=100000
debezium.sink.http.retry.interval.ms=50
debezium.source.connector.class=io.debezium.connector.postgresql.PostgresConnector
debezium.source.offset.storage.file.filename={offsets}
debezium.source.offset.flush.interval.ms=0
debezium.source.database.hostname=127.0.0.1
debezium.source.database.port={pg.port}
debezium.source.database.user=postgres
debezium.source.database.password=
debezium.source.database.dbname={db}
debezium.source.topic.prefix=bench
debezium.source.plugin.name=pgoutput
debezium.source.slot.name=outbox_bench
debezium.source.publication.autocreate.mode=filtered
debezium.source.table.include.list=public.outbox
debezium.source.snapshot.mode=no_data
debezium.source.tombstones.on.delete=false
debezium.source.max.batch.size=2048
debezium.source.max.queue.size=8192
debezium.source.poll.interval.ms=1
debezium.format.value=json
debezium.format.key=json
debezium.format.value.schemas.enable=false
debezium.format.key.schemas.enable=false
debezium.format.header=json
debezium.format.header.schemas.enable=false
debezium.transforms=outbox
debezium.transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
debezium.transforms.outbox.table.fields.additional.placement=seq:header:sequence,aggregateid:header:partitionkey
quarkus.log.level=WARN
quarkus.log.category."io.debezium".level=INFO
"""


def start_peer(h, ctx, pg, db, offsets):
    """Debezium Server when a Java 21+ is found, else the Engine peer; (process, how)."""
    j = java21()
    if j and os.environ.get("BENCH_DEBEZIUM", "server") == "server":
        d = server_dir(h)
        with open(os.path.join(d, "config", "application.properties"), "w") as f:
            f.write(server_config(ctx, pg, db, offsets))
        env = dict(os.environ, PATH=os.path.dirname(j) + os.pathsep + os.environ["PATH"],
                   JAVA_OPTS="-Xmx1g --add-opens=java.base/java.lang=ALL-UNNAMED")
        p = h.spawn(["./run.sh"], os.path.join(h.RUN, "debezium.log"), env=env, cwd=d)
        return p, f"Debezium Server 3.6.1.Final, HTTP sink (one POST per record, in order), {j}"
    p = h.spawn(["java", "-Xmx1g", "-jar", peer_jar(h), "127.0.0.1", str(pg.port), db, "postgres",
                 ctx.receiver_url, offsets, "outbox_bench"], os.path.join(h.RUN, "debezium.log"))
    return p, "Debezium Engine 3.6.1.Final (embedded, bench/peers/debezium), one sender in commit order"


def _reset_receiver(h, ctx):
    h.http_json(ctx.receiver_url + "/_reset", method="POST")


def _load(h, ctx, url, mode, run_id, extra=()):
    size = ctx.size
    cmd = [ctx.example("outbox_load"), "--url", url, "--mode", mode, "--receiver", ctx.receiver_url,
           "--n", str(size["dbz_n"]), "--streams", str(size["dbz_streams"]),
           "--connections", str(CONNECTIONS), "--run-id", run_id,
           "--timeout", str(size.get("peer_timeout", 600))] + list(extra)
    h.log("$ " + " ".join(cmd))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(h, p):
    out, err = p.communicate()
    if err.strip():
        h.log("outbox_load: " + err.strip()[-500:])
    if p.returncode != 0:
        raise RuntimeError(f"outbox_load failed ({p.returncode}): {err.strip()[-300:]}")
    return json.loads(out.strip().splitlines()[-1])


def run_debezium(h, ctx, pg):
    db = "dbz_app"
    pg.psql(f"CREATE DATABASE {db}")
    ready = os.path.join(h.RUN, "dbz-tables.ready")
    go = os.path.join(h.RUN, "dbz-reading.ready")
    for f in (ready, go):
        if os.path.exists(f):
            os.remove(f)
    offsets = os.path.join(h.RUN, "debezium-offsets.dat")
    if os.path.exists(offsets):
        os.remove(offsets)
    _reset_receiver(h, ctx)
    # The load generator creates the tables, then waits for the engine to
    # hold its slot and publication before it writes.
    load = _load(h, ctx, pg.url(db), "debezium", "dbz", ["--tables-ready", ready, "--wait-for", go])
    deadline = time.time() + 120
    while not os.path.exists(ready):
        if time.time() > deadline or load.poll() is not None:
            raise RuntimeError("outbox_load did not create its tables")
        time.sleep(0.1)
    java, how = start_peer(h, ctx, pg, db, offsets)
    try:
        deadline = time.time() + 180
        while True:
            active = pg.psql("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'outbox_bench' "
                             "AND active", db)
            if active == "1":
                break
            if time.time() > deadline or java.poll() is not None:
                raise RuntimeError("the Debezium engine did not start streaming (see .bench/run/debezium.log)")
            time.sleep(0.2)
        time.sleep(1.0)  # the first poll of the stream after the slot went active
        open(go, "w").close()
        r = _result(h, load)
        r["how"] = how
    finally:
        h.stop(java)
        if load.poll() is None:
            load.kill()
    try:
        pg.psql("SELECT pg_drop_replication_slot('outbox_bench')", db)
    except subprocess.CalledProcessError:
        pass
    return r


def run_outboxd(h, ctx, pg):
    db = "outboxd_app"
    pg.psql(f"CREATE DATABASE {db}")
    od = h.Outboxd(ctx, 1, "webhook", "dbz-outboxd", db=(db, pg.url(db)))
    od.migrate()
    _reset_receiver(h, ctx)
    od.start()
    try:
        r = _result(h, _load(h, ctx, pg.url(db), "outboxd", "odx"))
    finally:
        for p in od.procs:
            h.stop(p)
        od.procs = []
    return r


def stage(ctx, h):
    """Run both sides on one private cluster; `h` is the harness module (run.py)."""
    size = ctx.size
    if "dbz_n" not in size:
        return {"skipped": f"no debezium size for mode {ctx.mode}"}
    probe = server_probe()
    pg = PrivateCluster(h)
    pg.start()
    out = {"n": size["dbz_n"], "streams": size["dbz_streams"], "connections": CONNECTIONS,
           "server_probe": probe}
    try:
        h.log(f"debezium: private cluster on port {pg.port}")
        out["debezium"] = run_debezium(h, ctx, pg)
        out["how"] = out["debezium"].pop("how")
        out["outboxd"] = run_outboxd(h, ctx, pg)
    finally:
        pg.stop()
    d, o = out["debezium"], out["outboxd"]
    out["ratio_eps"] = (o["eps"] / d["eps"]) if d.get("eps") else None
    return out


def markdown(res):
    """Section 8 of latest.md."""
    if not res or "skipped" in res:
        return []
    lines = ["", "## 8. Debezium: in-transaction outbox, commit → arrival", "",
             f"{res['n']:,} application transactions (one `orders` row + one outbox event each) over "
             f"{res['streams']:,} aggregates on {res['connections']} connections, on a private PostgreSQL 15 "
             f"cluster with `wal_level = logical`. Debezium: {res['how']}; pgoutput, outbox EventRouter, offset "
             "committed after 2xx. outboxd: one `outboxd run`, webhook sink, `outboxd.enqueue` in the same "
             "transaction. Same receiver.", "",
             "| side | events/s | commit→arrival p50 ms | p99 ms | delivered | re-deliveries | order violations |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for side in ("debezium", "outboxd"):
        r = res.get(side) or {}
        lat = r.get("commit_to_arrival_ms") or {}
        lines.append(f"| {side} | {r.get('eps', 0):,.0f} | {lat.get('p50', float('nan')):.1f} | "
                     f"{lat.get('p99', float('nan')):.1f} | {r.get('delivered', 0):,} | {r.get('redeliveries')} | "
                     f"{r.get('order_violations')} |")
    if res.get("ratio_eps"):
        lines += ["", f"outboxd / Debezium events/s: {res['ratio_eps']:.2f}×"]
    lines += ["", f"Debezium Server distribution on Maven Central (HEAD): {res.get('server_probe')}"]
    return lines

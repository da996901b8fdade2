"""The new sources' benchmark stages (4f Neo4j, 4g CouchDB), called by run.py.

Owns: running bench/rust/examples/neo4j_bench.rs (the relay, and --takeover against
the vault's dispatcher) and bench/rust/examples/couchdb_bench.rs
at the run's size and reading the one JSON line each prints last. Each
function takes run.py's ctx (ctx.mode, ctx.example(name), ctx.bin) and
returns a dict for ctx.results. Must never measure anything itself or start
services of its own: the examples start their embedded Neo4j and
pouchdb-server and stop them.
"""

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NEO4J_SIZES = {
    # nodes, streams, claim backlogs, claims timed per backlog
    "ci": dict(nodes=1_000, streams=10, claim=[1_000, 5_000], claim_samples=5),
    "small": dict(nodes=10_000, streams=100, claim=[10_000, 100_000], claim_samples=20),
    "full": dict(nodes=100_000, streams=1_000, claim=[10_000, 1_000_000], claim_samples=40),
}

TAKEOVER_SIZES = {
    # vault nodes, packets, longest drain per side (s)
    "ci": dict(nodes=1_000, packets=10, window=30),
    "small": dict(nodes=10_000, packets=100, window=60),
    "full": dict(nodes=100_000, packets=1_000, window=120),
}

COUCHDB_SIZES = {
    # documents, rounds, documents of the latency run
    "ci": dict(docs=200, rounds=1, latency_docs=50),
    "small": dict(docs=2_000, rounds=2, latency_docs=200),
    "full": dict(docs=10_000, rounds=2, latency_docs=500),
}


def _log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _last_json(cmd, what, **kw):
    _log("$ " + " ".join(cmd))
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        raise RuntimeError(f"{what} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    # The example's own report lines (figures as they come, a relay's
    # warnings, databases dropped) go to the bench log.
    for line in out.stderr.strip().splitlines()[-200:]:
        _log(line)
    for line in reversed(out.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"{what} printed no JSON line:\n{out.stdout[-2000:]}")


def neo4j(ctx):
    """Nodes relayed per second by the `neo4j` source with 1 and 3 relays
    (outboxd processes on one PostgreSQL, native discard sink) against a
    plain neo4rs + sqlx program, and the claim's time at two backlogs."""
    s = NEO4J_SIZES[ctx.mode]
    cmd = [ctx.example("neo4j_bench"), "--nodes", str(s["nodes"]), "--streams", str(s["streams"]),
           "--relays", "1,3", "--claim", ",".join(str(c) for c in s["claim"]),
           "--claim-samples", str(s["claim_samples"]), "--outboxd", os.path.join(ctx.bin, "outboxd")]
    return _last_json(cmd, "neo4j_bench", cwd=ROOT)


def takeover(ctx):
    """Vault nodes delivered per second from a backlog by the vault's own
    dispatcher (1 and 3 processes, its defaults) against outboxd with
    deploy/vault/ (1 and 3 relays), both to the same receiver."""
    s = TAKEOVER_SIZES[ctx.mode]
    cmd = [ctx.example("neo4j_bench"), "--takeover", "--vault-nodes", str(s["nodes"]),
           "--vault-packets", str(s["packets"]), "--vault-window", str(s["window"]),
           "--dispatchers", "1,3", "--relays", "1,3", "--outboxd", os.path.join(ctx.bin, "outboxd")]
    return _last_json(cmd, "neo4j_bench --takeover", cwd=ROOT)


def couchdb(ctx):
    """Entries relayed, published and marked per second by the `couchdb`
    source + `amqp` + `couchdb-mark` against a plain reqwest + lapin
    program, and save → marked published p50/p99."""
    s = COUCHDB_SIZES[ctx.mode]
    cmd = [ctx.example("couchdb_bench"), "--docs", str(s["docs"]), "--rounds", str(s["rounds"]),
           "--latency-docs", str(s["latency_docs"])]
    return _last_json(cmd, "couchdb_bench", cwd=ROOT)


def fmt(x, digits=0):
    if x is None:
        return "–"
    return f"{x:,.{digits}f}" if isinstance(x, float) else f"{x:,}"


def markdown(R):
    """Sections 4f and 4g of the report (empty when not run)."""
    out = []
    n4 = R.get("neo4j")
    if n4:
        out += ["", "## 4f. The neo4j source", "",
                f"`bench/rust/examples/neo4j_bench.rs`: {n4['nodes']:,} pending outbox nodes over {n4['streams']:,} "
                "streams in an embedded Neo4j 5.26 (`tests/neo4j/`), relayed by outboxd processes on one fresh "
                f"PostgreSQL database (the `neo4j` source, batch {n4['batch']}, into the native discard sink), "
                "against a plain neo4rs + sqlx loop reading 100 pending nodes, storing them as events in one "
                "transaction and marking them (no lock-first claim, no head check, no lease, no deliveries). "
                "*relayed/s*: nodes over first → last `deliveredAt`; *wall/s*: over process start → last mark.", "",
                "| relay | relayed/s | wall/s |", "|---|---|---|"]
        for r in n4["relays"]:
            out.append(f"| outboxd, {r['relays']} process(es) | {fmt(r['relayed_per_s'])} | {fmt(r['wall_per_s'])} |")
        if n4.get("plain"):
            out.append(f"| plain neo4rs + sqlx | {fmt(n4['plain']['relayed_per_s'])} | "
                       f"{fmt(n4['plain']['wall_per_s'])} |")
        out += ["", f"outboxd (1) / plain: **{fmt(n4.get('outboxd_1_vs_plain'), 2)}**; 3 relays / 1: "
                    f"**{fmt(n4.get('relays_3_vs_1'), 2)}**.", "",
                f"Claim (`Outbox::claim(100)`: shortlist + lock-first claim; {n4['claim_samples']} timed per "
                "backlog, random UUID ids over 1,000 streams):", "",
                "| pending | p50 ms | mean ms | nodes per claim |", "|---|---|---|---|"]
        for c in n4["claim"]:
            out.append(f"| {c['pending']:,} | {c['p50_ms']:.1f} | {c['mean_ms']:.1f} | {c['claimed_per_call']:.0f} |")
        out += ["", f"Largest / smallest backlog (p50): **{fmt(n4.get('claim_large_vs_small'), 2)}** (aim ≤ 2)."]
    tk = R.get("takeover")
    if tk:
        out += ["", "## 4h. Taking over a vault's outbox", "",
                f"`bench/rust/examples/neo4j_bench.rs --takeover`: {tk['nodes']:,} outbox nodes over "
                f"{tk['packets']:,} packets written in the vault's own shape and types, drained into one "
                "awareness-shaped receiver by the vault's dispatcher (`tests/vault/vault.mjs`, its protocol and "
                "defaults: batch 50, poll 1 s) and, on a fresh backlog, by outboxd with `deploy/vault/` "
                "(`delivered-when = \"acknowledged\"`, the `awareness` sink). Both lease lock-first, keep one "
                "node per packet in flight and mark a node delivered once the receiver answered. "
                f"*delivered/s*: nodes over first → last `acknowledgedAt`, within {tk['window_s']} s.", "",
                "| side | processes | delivered/s | delivered |", "|---|---|---|---|"]
        for r in tk["runs"]:
            out.append(f"| {r['side']} | {r['processes']} | {fmt(r['delivered_per_s'])} | {r['delivered']:,} |")
        out += ["", f"outboxd 1 / dispatcher 1: **{fmt(tk.get('relays_1_vs_dispatchers_1'), 2)}**; "
                    f"3 / 3: **{fmt(tk.get('relays_3_vs_dispatchers_3'), 2)}** (aim ≥ 1)."]
    cd = R.get("couchdb")
    if cd:
        out += ["", "## 4g. The couchdb source", "",
                f"`bench/rust/examples/couchdb_bench.rs`: {cd['docs']:,} documents with one pending entry each in "
                "pouchdb-server, relayed + published (RabbitMQ) + marked by outboxd (`couchdb` source → "
                "`amqp` → `couchdb-mark`) against a plain reqwest + lapin program doing the same three steps; "
                f"means of {cd['rounds']} alternating rounds.", "",
                "| side | entries/s |", "|---|---|",
                f"| outboxd | {fmt(cd['outboxd_entries_per_s'], 1)} |",
                f"| plain reqwest + lapin | {fmt(cd['plain_entries_per_s'], 1)} |",
                f"| **ratio** | **{cd['ratio']:.2f}** |", "",
                f"Save → marked published ({cd['latency_docs']:,} documents at a steady pace): "
                f"p50 {cd['save_to_marked_p50_ms']:,} ms, p99 {cd['save_to_marked_p99_ms']:,} ms."]
    return out


def summary(R, s):
    """Add the sources' ratios to run.py's summary dict `s`."""
    n4 = R.get("neo4j")
    if n4:
        if n4.get("outboxd_1_vs_plain") is not None:
            s["neo4j source (1 relay) / plain neo4rs + sqlx"] = n4["outboxd_1_vs_plain"]
        if n4.get("relays_3_vs_1") is not None:
            s["neo4j source 3 relays / 1 relay"] = n4["relays_3_vs_1"]
        if n4.get("claim_large_vs_small") is not None:
            c = n4["claim"]
            s[f"neo4j claim {c[-1]['pending']:,} / {c[0]['pending']:,} pending (p50)"] = n4["claim_large_vs_small"]
    tk = R.get("takeover")
    if tk:
        for key, name in [("relays_1_vs_dispatchers_1", "1"), ("relays_3_vs_dispatchers_3", "3")]:
            if tk.get(key) is not None:
                s[f"vault takeover: outboxd {name} / the vault's dispatcher {name}"] = tk[key]
    cd = R.get("couchdb")
    if cd:
        s["couchdb source / plain reqwest + lapin"] = cd["ratio"]

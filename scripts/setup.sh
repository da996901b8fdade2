#!/usr/bin/env bash
# One-time machine set-up for building and testing outboxd on Debian, from
# nothing: installs what is missing and starts what is down, nothing more.
#
#   - system packages: PostgreSQL, RabbitMQ, Node.js + npm, Python's venv
#     support, Java 17 + Maven (the embedded Neo4j of the tests), a C
#     toolchain and curl, Chromium and its WebDriver (the console's
#     browser tests), procps (`kill`, with which tests signal what they
#     started);
#   - PostgreSQL: a cluster (created when there is none), trust for loopback
#     TCP, started without systemd, waited for on 127.0.0.1:5432;
#   - RabbitMQ: started detached, waited for on 127.0.0.1:5672;
#   - the Rust target wasm32-wasip2 (every plugin is built for it);
#   - Python's openapi-spec-validator (the HTTP API description's check).
#   - mdBook, pinned, into target/tools/bin (the test command builds the
#     manual with it).
#
# Each step runs only when its result is missing, so a second run changes
# nothing and takes seconds. A step that fails says what failed and how to
# do it by hand; a service that does not come up within its bound stops the
# script with the last lines of its log.
#
# Usage: scripts/setup.sh               everything the tests need
#        scripts/setup.sh --build-only  only what building and the quickstart
#                                       need (no services): the quickstart
#                                       runs on the embedded SQLite default
# (as root, or as a user with sudo)
set -euo pipefail

build_only=0
case "${1:-}" in
    "") ;;
    --build-only) build_only=1 ;;
    *) echo "usage: scripts/setup.sh [--build-only]" >&2; exit 2 ;;
esac

# Readiness bounds, in seconds.
PG_READY_TIMEOUT=60
AMQP_READY_TIMEOUT=120

say() { echo "setup: $*"; }
fail() {
    echo "setup: FAILED: $1" >&2
    shift
    for line in "$@"; do echo "setup:   $line" >&2; done
    exit 1
}

as_root=()
[[ "$(id -u)" -eq 0 ]] || as_root=(sudo)

# --- system packages --------------------------------------------------------

need_apt=()
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need_apt+=(python3-venv)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
if ((!build_only)); then
# Node.js and npm build the JavaScript sink and run the benchmark's peers.
command -v node >/dev/null 2>&1 || need_apt+=(nodejs)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
command -v pg_ctlcluster >/dev/null 2>&1 && ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 ||
    need_apt+=(postgresql)
command -v rabbitmq-server >/dev/null 2>&1 || need_apt+=(rabbitmq-server)
# Java 17 or newer and Maven run the embedded Neo4j the relay's tests use.
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1; }
if ! command -v java >/dev/null 2>&1 || [[ "$(java_major)" -lt 17 ]]; then
    need_apt+=(openjdk-17-jdk-headless)
fi
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
# The model checker for model/ (the delivery protocol, checked by model/check.sh).
command -v spin >/dev/null 2>&1 || need_apt+=(spin)
# A real browser and its WebDriver for the console's browser tests.
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
# `kill` as a program (not the shell's builtin): the tests signal the
# servers they start, and the browsers a finished console test leaves.
[[ -x /bin/kill || -x /usr/bin/kill ]] || need_apt+=(procps)
fi

if ((${#need_apt[@]})); then
    say "installing ${need_apt[*]}"
    # Debian's service packages try to start through systemd, which a
    # container does not have; the starts below do it by hand instead.
    "${as_root[@]}" apt-get update -q ||
        fail "apt-get update" "check the network and /etc/apt/sources.list, then run: apt-get update"
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -q --no-install-recommends \
        "${need_apt[@]}" ||
        fail "apt-get install ${need_apt[*]}" "run by hand: apt-get install ${need_apt[*]}"
fi

# The OpenAPI 3.1 validator the HTTP API's description is checked with
# (tests/integration_openapi.rs).
if ((!build_only)) && ! python3 -c 'import openapi_spec_validator' >/dev/null 2>&1; then
    say "installing openapi-spec-validator (pip)"
    python3 -m pip install -q openapi-spec-validator ||
        fail "pip install openapi-spec-validator" \
            "run by hand: python3 -m pip install openapi-spec-validator (or apt-get install python3-openapi-spec-validator)"
fi

# --- Rust -------------------------------------------------------------------

command -v cargo >/dev/null 2>&1 ||
    fail "no cargo on PATH" "install the Rust toolchain with rustup: https://rustup.rs"
if command -v rustup >/dev/null 2>&1; then
    if ! rustup target list --installed | grep -qx wasm32-wasip2; then
        say "adding the Rust target wasm32-wasip2"
        rustup target add wasm32-wasip2 ||
            fail "rustup target add wasm32-wasip2" "every plugin is built for it; run it by hand"
    fi
elif ! rustc --print target-libdir --target wasm32-wasip2 >/dev/null 2>&1; then
    fail "the Rust target wasm32-wasip2 is missing and there is no rustup" \
        "install the toolchain with rustup, then: rustup target add wasm32-wasip2"
fi

if ((build_only)); then
    say "ready to build: wasm32-wasip2, $(python3 --version)"
    exit 0
fi

# --- PostgreSQL -------------------------------------------------------------
# The tests run against a real server on 127.0.0.1:5432 and connect as
# `postgres` over loopback TCP with trust authentication (loopback only);
# each test creates and drops its own database or schema.

pg_ready() { (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; }
pg_version="$(ls /usr/lib/postgresql | sort -V | tail -n1)"
if [[ -z "$pg_version" ]]; then
    fail "PostgreSQL has no server binaries under /usr/lib/postgresql" "run: apt-get install postgresql"
fi
if ! pg_lsclusters -h 2>/dev/null | awk '{print $1, $2}' | grep -qx "$pg_version main"; then
    say "creating PostgreSQL $pg_version cluster main"
    "${as_root[@]}" pg_createcluster "$pg_version" main ||
        fail "pg_createcluster $pg_version main" "run: pg_createcluster $pg_version main"
fi
pg_conf_dir="/etc/postgresql/$pg_version/main"
hba="$pg_conf_dir/pg_hba.conf"
hba_changed=0
if ! "${as_root[@]}" grep -q "^host all all 127.0.0.1/32 trust" "$hba"; then
    say "trusting loopback TCP in $hba"
    "${as_root[@]}" sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba" ||
        fail "editing $hba" "add 'host all all 127.0.0.1/32 trust' as its first line"
    hba_changed=1
fi
pg_log="/var/log/postgresql/postgresql-$pg_version-main.log"
if ! pg_ready; then
    say "starting PostgreSQL $pg_version"
    "${as_root[@]}" pg_ctlcluster --skip-systemctl-redirect "$pg_version" main start ||
        fail "pg_ctlcluster $pg_version main start" "last lines of $pg_log:" \
            "$("${as_root[@]}" tail -n 20 "$pg_log" 2>/dev/null)"
    for _ in $(seq 1 "$PG_READY_TIMEOUT"); do pg_ready && break; sleep 1; done
elif ((hba_changed)); then
    # A server started before the edit still reads the old file.
    "${as_root[@]}" pg_ctlcluster --skip-systemctl-redirect "$pg_version" main reload
fi
pg_ready || fail "PostgreSQL does not answer on 127.0.0.1:5432 after ${PG_READY_TIMEOUT}s" \
    "last lines of $pg_log:" "$("${as_root[@]}" tail -n 20 "$pg_log" 2>/dev/null)"
# A server that accepts TCP can still be recovering: wait until it answers
# a query, within the same bound.
for _ in $(seq 1 "$PG_READY_TIMEOUT"); do
    psql -h 127.0.0.1 -U postgres -d postgres -Atqc 'select 1' >/dev/null 2>&1 && break
    sleep 1
done
psql -h 127.0.0.1 -U postgres -d postgres -Atqc 'select 1' >/dev/null ||
    fail "PostgreSQL answers on 5432 but 'psql -h 127.0.0.1 -U postgres' fails" \
        "check the trust lines at the top of $hba"

# --- RabbitMQ ---------------------------------------------------------------
# The amqp sink's tests publish to a real broker on 127.0.0.1:5672 with the
# default guest/guest account (guest may log in from loopback only, which is
# all the tests need).

amqp_ready() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }
amqp_log() { "${as_root[@]}" sh -c 'tail -n 20 "$(ls -t /var/log/rabbitmq/*.log 2>/dev/null | head -n1)"' 2>/dev/null; }
if ! amqp_ready; then
    say "starting RabbitMQ"
    # Debian's package leaves the server stopped where there is no systemd.
    "${as_root[@]}" rabbitmq-server -detached >/dev/null 2>&1 ||
        fail "rabbitmq-server -detached" "last lines of its log:" "$(amqp_log)"
    for _ in $(seq 1 "$AMQP_READY_TIMEOUT"); do amqp_ready && break; sleep 1; done
fi
amqp_ready || fail "RabbitMQ does not answer on 127.0.0.1:5672 after ${AMQP_READY_TIMEOUT}s" \
    "last lines of its log:" "$(amqp_log)"

# --- Neo4j (tests) ----------------------------------------------------------
# The embedded Neo4j 5.26 of the Neo4j relay's tests: Maven fetches its jars
# from Maven Central once (~120 MB into ~/.m2) and builds the launcher into
# target/neo4j-embedded/; tests/common/neo4j.rs starts it with plain java.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
neo4j_out="$root/target/neo4j-embedded/classes"
if [[ ! -d "$neo4j_out" ]] || [[ -n "$(find "$root/tests/neo4j" -newer "$neo4j_out" -type f 2>/dev/null | head -n1)" ]]; then
    say "building the embedded Neo4j of the tests (tests/neo4j)"
    mvn -q -B package -DskipTests -f "$root/tests/neo4j/pom.xml" ||
        fail "mvn package -f tests/neo4j/pom.xml" "run it by hand; it needs Maven Central once"
fi

# --- pouchdb-server (tests) -------------------------------------------------
# The CouchDB-protocol server of the couchdb source's tests, pinned by
# tests/couchdb/package-lock.json (tests/common/couchdb.rs runs the same
# install when it is missing).
pouch="$root/tests/couchdb"
if [[ ! -d "$pouch/node_modules" ]] || [[ "$pouch/package-lock.json" -nt "$pouch/node_modules" ]]; then
    say "installing pouchdb-server (tests/couchdb)"
    npm ci --prefix "$pouch" --no-audit --no-fund --loglevel=error ||
        fail "npm ci --prefix tests/couchdb" "run it by hand; it needs the npm registry once"
fi

# --- the vault's programs (tests) --------------------------------------------
# The vault's outbox writer and dispatcher of the takeover tests run on the
# official Neo4j JavaScript driver, pinned by tests/vault/package-lock.json
# (tests/integration_takeover.rs runs the same install when it is missing).
vault="$root/tests/vault"
if [[ ! -d "$vault/node_modules" ]] || [[ "$vault/package-lock.json" -nt "$vault/node_modules" ]]; then
    say "installing neo4j-driver (tests/vault)"
    npm ci --prefix "$vault" --no-audit --no-fund --loglevel=error ||
        fail "npm ci --prefix tests/vault" "run it by hand; it needs the npm registry once"
fi

# --- mdBook (the manual) -----------------------------------------------------
# scripts/test.sh builds docs/ with it. Pinned, from crates.io, into the build
# cache's target/tools/bin (target/ may be a link into ~/.cache/outboxd), so a
# machine compiles it once; a different version there is replaced.
MDBOOK_VERSION=0.5.4
mdbook="$root/target/tools/bin/mdbook"
if [[ "$("$mdbook" --version 2>/dev/null)" != "mdbook v$MDBOOK_VERSION" ]]; then
    say "installing mdbook $MDBOOK_VERSION into target/tools (once; a few minutes)"
    cargo install --locked --quiet mdbook --version "$MDBOOK_VERSION" \
        --no-default-features --features search --root "$root/target/tools" ||
        fail "cargo install mdbook $MDBOOK_VERSION" \
            "run by hand: cargo install --locked mdbook --version $MDBOOK_VERSION --root target/tools"
fi

say "ready: PostgreSQL $pg_version on 127.0.0.1:5432, RabbitMQ on 127.0.0.1:5672, wasm32-wasip2, $(java -version 2>&1 | head -n1), node $(node --version), $("$mdbook" --version)"

#!/usr/bin/env bash
# One-time machine set-up for building and testing outboxd on Debian:
# the wasm32-wasip2 Rust target and the system packages the tests use
# (PostgreSQL, RabbitMQ), started when they are down.
# Safe to run again; it only installs what is missing.
set -euo pipefail

need_apt=()
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
# Node.js and npm build the JavaScript sink (scripts/build-js-plugins.sh)
# and run the benchmark's peers.
command -v npm >/dev/null 2>&1 || need_apt+=(nodejs npm)
# Java 17 and Maven run the embedded Neo4j of the Neo4j relay's tests
# (tests/neo4j/).
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null 2>&1 || need_apt+=(maven)
if ((${#need_apt[@]})); then
    sudo_cmd=()
    [[ "$(id -u)" -eq 0 ]] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q "${need_apt[@]}"
fi

# PostgreSQL: the tests run against a real server on 127.0.0.1:5432 with
# trust authentication for local TCP connections.
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    sudo_cmd=()
    [[ "$(id -u)" -eq 0 ]] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q postgresql
fi
pg_ready() { (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; }
version="$(ls /etc/postgresql | sort -V | tail -n1)"
hba="/etc/postgresql/$version/main/pg_hba.conf"
# A fresh Debian cluster wants passwords on TCP; the tests connect as
# `postgres` over loopback with trust (loopback only).
hba_changed=0
if [[ -f "$hba" ]] && ! grep -q "^host all all 127.0.0.1/32 trust" "$hba"; then
    sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    hba_changed=1
fi
if ! pg_ready; then
    pg_ctlcluster --skip-systemctl-redirect "$version" main start
    for _ in $(seq 1 30); do pg_ready && break; sleep 1; done
elif ((hba_changed)); then
    # The package's own start (systemd) read the old file.
    pg_ctlcluster --skip-systemctl-redirect "$version" main reload
fi
pg_ready || { echo "setup: PostgreSQL does not answer on 127.0.0.1:5432" >&2; exit 1; }

# RabbitMQ: the amqp sink's tests publish to a real broker on
# 127.0.0.1:5672 with the default guest/guest account (guest may log in
# from loopback only, which is all the tests need).
if ! command -v rabbitmq-server >/dev/null 2>&1; then
    sudo_cmd=()
    [[ "$(id -u)" -eq 0 ]] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q rabbitmq-server
fi
amqp_ready() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }
if ! amqp_ready; then
    # Debian's package may have started it through systemd already; where
    # there is no systemd (containers, CI) start it detached.
    rabbitmq-server -detached || true
    for _ in $(seq 1 60); do amqp_ready && break; sleep 1; done
fi
amqp_ready || { echo "setup: RabbitMQ does not answer on 127.0.0.1:5672" >&2; exit 1; }

if ! rustup target list --installed | grep -qx wasm32-wasip2; then
    rustup target add wasm32-wasip2
fi

# The embedded Neo4j 5.26 of the Neo4j relay's tests: Maven fetches its jars
# from Maven Central once (~120 MB into ~/.m2) and builds the launcher into
# target/neo4j-embedded/; tests/common/neo4j.rs starts it with plain java.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mvn -q -B package -DskipTests -f "$root/tests/neo4j/pom.xml"

#!/usr/bin/env bash
# outboxd benchmarks: raw-SQL ceiling, outboxd end to end, latency, plugin
# share, claim cost, memory and peers, all from one run, back to back.
#
#   bench/run.sh            small (10,000 events / 100 streams), a few minutes
#   bench/run.sh --full     full (100,000 events / 1,000 streams, claim up to 1M)
#   bench/run.sh --ci       tiny, debug build, no peers: proves the harness runs
#
# Needs PostgreSQL on 127.0.0.1:5432 with trust auth (OUTBOXD_TEST_PG names
# another admin URL), Rust with the wasm32-wasip2 target, Node.js/npm and
# Python 3 (peers are installed from npm and PyPI into .bench/, which git
# ignores). Results: bench/results/latest.{json,md} (--ci: ci.{json,md}).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/run.py "$@"

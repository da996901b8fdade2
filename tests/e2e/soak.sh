#!/usr/bin/env bash
# Soak: --events events (default 200,000) through the webhook and amqp sinks
# on PostgreSQL, with --kills SIGKILLs of outboxd at random moments (default
# 100) and --broker-restarts restarts of RabbitMQ (default 2; a node of the
# run's own, so no other user of the machine's broker is disturbed). Prints
# loss, order violations and re-deliveries per sink and exits non-zero on
# any loss or order violation. See tests/e2e/soak.py for what is checked.
#
# Usage: tests/e2e/soak.sh [--events N] [--kills K] [--broker-restarts R] [--seed N] ...
#
# Needs PostgreSQL on 127.0.0.1:5432 (trust) and the RabbitMQ server
# installed (scripts/setup.sh provides both), and root or the rabbitmq user
# to start a RabbitMQ node. The Python packages are those of the end-to-end
# test (target/e2e-venv, tests/e2e/requirements.txt).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
# shellcheck source=tests/e2e/venv.sh
source "$repo/tests/e2e/venv.sh"

cargo build -p outboxd
bash scripts/build-plugins.sh

exec "$venv/bin/python" "$repo/tests/e2e/soak.py" \
    --outboxd "$repo/target/debug/outboxd" --plugins-src "$repo/target/plugins" "$@"

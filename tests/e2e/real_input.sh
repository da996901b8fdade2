#!/usr/bin/env bash
# End to end on real input, with real clients, through crashes: outboxd on
# PostgreSQL with the webhook and amqp sinks, every payload of a cases folder
# sent as a CloudEvent (Python `cloudevents` SDK), received and verified with
# `standardwebhooks` and `pika`, while outboxd is killed with SIGKILL and
# restarted several times. Prints a report and exits non-zero if any check
# fails. See tests/e2e/real_input.py for what is checked and how.
#
# Usage: tests/e2e/real_input.sh [--cases DIR] [--kills N] [--seed N] [--keep] ...
#        (default cases: tests/cases/github-webhooks)
#
# Needs PostgreSQL on 127.0.0.1:5432 (trust) and RabbitMQ on 127.0.0.1:5672
# (guest/guest), as scripts/setup.sh provides; creates and drops a database
# and an exchange/queue of its own. The Python packages go into a virtual
# environment in target/e2e-venv, pinned in tests/e2e/requirements.txt.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
# shellcheck source=tests/e2e/venv.sh
source "$repo/tests/e2e/venv.sh"

cargo build -p outboxd
bash scripts/build-plugins.sh

exec "$venv/bin/python" "$repo/tests/e2e/real_input.py" \
    --outboxd "$repo/target/debug/outboxd" --plugins-src "$repo/target/plugins" "$@"

#!/usr/bin/env bash
# Build outboxd and its plugins, then run the end-to-end demo
# (scripts/quickstart.py).  Extra arguments are passed to the demo, e.g.
#
#   scripts/quickstart.sh --cases path/to/payloads --timeout 300
#
# It runs from the repository root, so relative paths in the arguments are
# taken relative to the root, whatever the current directory.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh --build-only
bash scripts/build-plugins.sh
cargo build -p outboxd

exec python3 scripts/quickstart.py \
    --outboxd "$PWD/target/debug/outboxd" \
    --plugins-dir "$PWD/target/plugins" \
    "$@"

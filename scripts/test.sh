#!/usr/bin/env bash
# The whole test suite: set-up, plugins built from source, then every
# unit and integration test against real servers on loopback.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Each step says when it starts, in seconds since the script began.
step() { echo "test.sh: [${SECONDS}s] $*"; }
trap 'echo "test.sh: [${SECONDS}s] ended with status $?"' EXIT

# The build goes to a cache outside the clone that later runs on this
# machine reuse (OUTBOXD_BUILD_CACHE=off builds in the clone); first, since
# set-up already builds into target/.
step "build cache"
bash scripts/build-cache.sh

step "set-up"
bash scripts/setup.sh

# The house's habits first: formatted, and clippy without a warning.
step "format and clippy"
cargo fmt --all --check
cargo clippy --workspace --all-targets -- -D warnings

# The manual (docs/, mdBook pinned by setup.sh) builds into target/book;
# its links, references and examples are checked by tests/integration_docs.rs.
step "the manual"
target/tools/bin/mdbook build docs

step "plugins, then the host's tests"
bash scripts/build-plugins.sh
cargo test --workspace --no-fail-fast

# The sinks' own unit tests, run natively (plugins/ is a workspace of its own).
step "the sinks' own tests"
cargo fmt --manifest-path plugins/Cargo.toml --all --check
CARGO_TARGET_DIR=target/wasm cargo clippy --manifest-path plugins/Cargo.toml --workspace --all-targets -- -D warnings
CARGO_TARGET_DIR=target/wasm cargo test --manifest-path plugins/Cargo.toml --workspace

# The delivery protocol, model-checked exhaustively (spin), mutants included.
step "model check"
bash model/check.sh

# End to end on real input with real clients, through SIGKILLs.
step "end to end"
bash tests/e2e/real_input.sh
bash tests/e2e/soak.sh --events 5000 --kills 5 --broker-restarts 1

# The benchmark harness at its tiny size, to prove it runs (no thresholds).
step "benchmark harness, tiny"
bash bench/run.sh --ci

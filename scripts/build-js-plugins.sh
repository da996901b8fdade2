#!/usr/bin/env bash
# Build the sinks written in JavaScript (plugins/js-*/) into WebAssembly
# components with componentize-js, into target/plugins-js/NAME.wasm beside a
# copy of NAME.toml (a folder of their own: the default plugins folder,
# target/plugins, keeps only the Rust sinks). Drop them into a daemon's
# plugins folder to use them. Needs Node.js and npm; installs each plugin's pinned
# devDependencies (package-lock.json) into its node_modules/ once.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v npm >/dev/null || { echo "build-js-plugins: npm is required (Node.js 18 or newer)" >&2; exit 1; }
mkdir -p target/plugins-js
for dir in plugins/js-*/; do
    name=$(basename "$dir")
    if [ ! -d "$dir/node_modules/@bytecodealliance/componentize-js" ]; then
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
    fi
    out="target/plugins-js/$name.wasm"
    # Rebuild only when the source, the lock file or the WIT changed.
    if [ ! -f "$out" ] || [ -n "$(find "$dir"/*.js "$dir/package-lock.json" wit -newer "$out" 2>/dev/null | head -1)" ]; then
        (cd "$dir" && npm run --silent build)
    fi
    cp "$dir/$name.toml" target/plugins-js/
    echo "build-js-plugins: $name -> $out ($(stat -c %s "$out") bytes)"
done

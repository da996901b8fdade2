#!/usr/bin/env bash
# Build the sinks written in Python (plugins/py-*/) into WebAssembly
# components with componentize-py, into target/plugins-py/NAME.wasm beside a
# copy of NAME.toml (a folder of their own, as the JavaScript sinks have).
# Installs each plugin's pinned build tool (requirements.txt) into
# target/py-venv once (again when its scripts no longer run: target/ may be
# a build cache shared with a clone at another path, whose path the
# scripts' `#!` lines name). Needs python3 with venv, and PyPI (or a pip
# cache) the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/py-venv
if [ ! -x "$venv/bin/componentize-py" ] || ! "$venv/bin/pip" --version >/dev/null 2>&1; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    for req in plugins/py-*/requirements.txt; do
        "$venv/bin/pip" install --disable-pip-version-check -q -r "$req"
    done
fi
mkdir -p target/plugins-py
for dir in plugins/py-*/; do
    name=$(basename "$dir")
    out="target/plugins-py/$name.wasm"
    # Rebuild only when the source, the pinned tool or the WIT changed.
    if [ ! -f "$out" ] || [ -n "$(find "$dir" wit -newer "$out" -type f 2>/dev/null | head -1)" ]; then
        "$venv/bin/componentize-py" -d wit -w sink componentize -p "$dir" app -o "$out"
    fi
    cp "$dir/$name.toml" target/plugins-py/
    echo "build-py-plugins: $name -> $out ($(stat -c %s "$out") bytes)"
done

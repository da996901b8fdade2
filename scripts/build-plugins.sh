#!/usr/bin/env bash
# Builds every Rust sink in plugins/ for wasm32-wasip2 (release) and installs each
# `<name>.wasm` with its manifest `<name>.toml` into target/plugins/, the
# daemon's default plugins directory (a sink listed in `disabled` below with
# its manifest as `<name>.toml.example`).
#
# Usage: scripts/build-plugins.sh        (from any directory)
#
# Build outputs go to target/wasm/ so the source folders stay clean.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target=wasm32-wasip2
export CARGO_TARGET_DIR="$repo/target/wasm"
out="$repo/target/plugins"

if command -v rustup >/dev/null 2>&1; then
    if ! rustup target list --installed | grep -qx "$target"; then
        rustup target add "$target"
    fi
fi

cargo build --manifest-path "$repo/plugins/Cargo.toml" --workspace --release --target "$target"

# Sinks that serve one deployment's own service, with its secret taken from
# the environment, are installed disabled: their manifest goes in as
# `<name>.toml.example`, which the daemon does not load, so the default
# plugins directory keeps loading (and /ready keeps passing) without their
# variables. Copy it to `<name>.toml` next to the component to enable one.
disabled=(awareness)

mkdir -p "$out"
shopt -s nullglob
installed=0
for manifest in "$repo"/plugins/*/*.toml; do
    dir="$(dirname "$manifest")"
    name="$(basename "$manifest" .toml)"
    # A plugin's manifest is named after its folder; Cargo.toml is not one.
    [[ "$name" == "$(basename "$dir")" ]] || continue
    # Sinks in other languages (no Cargo.toml) have build scripts of their
    # own (scripts/build-js-plugins.sh).
    [[ -f "$dir/Cargo.toml" ]] || continue
    # Cargo names the cdylib after the crate, with `-` turned into `_`.
    wasm="$CARGO_TARGET_DIR/$target/release/${name//-/_}.wasm"
    if [[ ! -f "$wasm" ]]; then
        echo "build-plugins: $name: no $wasm after the build" >&2
        exit 1
    fi
    cp "$wasm" "$out/$name.wasm"
    if [[ " ${disabled[*]} " == *" $name "* ]]; then
        rm -f "$out/$name.toml"
        cp "$manifest" "$out/$name.toml.example"
        echo "build-plugins: $name -> $out/$name.wasm ($(wc -c <"$out/$name.wasm") bytes; disabled: copy $name.toml.example to $name.toml to enable)"
    else
        cp "$manifest" "$out/$name.toml"
        echo "build-plugins: $name -> $out/$name.wasm ($(wc -c <"$out/$name.wasm") bytes)"
    fi
    installed=$((installed + 1))
done

if [[ "$installed" -eq 0 ]]; then
    echo "build-plugins: no plugin found in $repo/plugins/*/<name>.toml" >&2
    exit 1
fi

#!/usr/bin/env bash
# Keeps the build outside the clone so that later runs on the same machine
# reuse it: when the clone has no target/ yet, target/ becomes a symlink to
#
#   ${OUTBOXD_BUILD_CACHE:-$HOME/.cache/outboxd/target}/<key>
#
# where <key> is a hash of `rustc -vV` and `cargo -V`, so a change of
# toolchain starts from an empty folder (the old one stays until deleted).
# Everything under target/ is cached this way: the host's and the plugins'
# Cargo builds, the built plugins, the Python virtual environments, the
# embedded Neo4j of the tests, test logs.
#
# It never deletes a build: a real target/ folder is left as it is (the
# build stays in the clone), and a link of ours (its folder holds the
# `.toolchain` this script writes) that names an older key or another cache
# root is re-pointed at the current one. OUTBOXD_BUILD_CACHE=off builds in
# the clone: a link of ours is removed (the cache folder stays) and Cargo
# makes a real target/.
#
# Usage: scripts/build-cache.sh   (from any directory; scripts/test.sh runs it)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
link="$repo/target"
root="${OUTBOXD_BUILD_CACHE:-$HOME/.cache/outboxd/target}"
say() { echo "build-cache: $*"; }

# A link this script made points at a folder holding its `.toolchain`.
ours() { [[ -L "$link" ]] && [[ -f "$(readlink "$link")/.toolchain" ]]; }

if [[ "$root" == off ]]; then
    if ours; then
        rm "$link"
        say "OUTBOXD_BUILD_CACHE=off: removed the link target/ (the cache folder stays); building in the clone"
    else
        say "OUTBOXD_BUILD_CACHE=off: building in the clone"
    fi
    exit 0
fi

if [[ -e "$link" && ! -L "$link" ]]; then
    say "target/ is a folder of the clone; building there (move it away to use the cache in $root)"
    exit 0
fi
# A dangling link (its cache folder was deleted) holds nothing: re-pointed.
if [[ -L "$link" && -e "$link" ]] && ! ours; then
    say "target/ links to $(readlink "$link"), which this script did not make; left as it is"
    exit 0
fi

if ! toolchain="$(rustc -vV 2>/dev/null && cargo -V 2>/dev/null)"; then
    say "no rustc or cargo on PATH; building in the clone"
    exit 0
fi
key="$(printf '%s\n' "$toolchain" | sha256sum | cut -c1-16)"
mkdir -p "$root/$key"
cache="$(cd "$root/$key" && pwd)"
printf '%s\n' "$toolchain" >"$cache/.toolchain"

if [[ "$(readlink "$link" 2>/dev/null)" == "$cache" ]]; then
    say "target/ -> $cache (reused)"
else
    [[ -L "$link" ]] && say "target/ re-pointed from $(readlink "$link") (another toolchain or cache folder)"
    ln -sfn "$cache" "$link"
    say "target/ -> $cache ($(rustc -V))"
fi

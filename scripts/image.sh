#!/usr/bin/env bash
# Build the outboxd OCI image and smoke-test it.
#
#   scripts/image.sh                 stage, build, smoke-test
#   scripts/image.sh --stage-only    stage target/image/context only (then
#                                    build it with docker, podman or buildah:
#                                    docs/guides/container.md)
#
# Env: IMAGE (default outboxd), TAG (default the crate's version),
#      BINARY (default: a fresh release build; another outboxd binary to
#      put in the image instead),
#      SMOKE_PORT (default 18080: the smoke daemon listens there, on the
#      host's network — buildah's chroot isolation has none of its own).
#
# Steps: the release binary (cargo build --release -p outboxd), the shipped
# plugins (scripts/build-plugins.sh), a root folder staged from them in
# target/image/context/root (the binary, the shared libraries `ldd` names,
# the CA bundle, /etc/passwd and /etc/group of the `outboxd` user, the
# configuration deploy/image/outboxd.toml), `buildah bud --isolation chroot`
# of deploy/image/Containerfile, then inside the image: `outboxd
# --version`, `outboxd plugin check` of each shipped sink, and a daemon
# started there answering /health (and /ready) on loopback. Installs
# buildah with apt when it is missing. Not part of scripts/test.sh (it
# needs root and a release build); run it by hand, like the benchmarks.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

stage_only=false
case "${1:-}" in
    --stage-only) stage_only=true ;;
    "") ;;
    *) echo "usage: scripts/image.sh [--stage-only]" >&2; exit 2 ;;
esac

image="${IMAGE:-outboxd}"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' host/Cargo.toml | head -n1)"
tag="${TAG:-$version}"
port="${SMOKE_PORT:-18080}"
uid=10001
context="$repo/target/image/context"
root="$context/root"
plugins_in_image=/usr/lib/outboxd/plugins
# Sinks that need a broker or a service the image cannot assume ship
# disabled (as NAME.toml.example), as build-plugins.sh ships `awareness`.
disabled=(amqp couchdb-mark awareness)

say() { printf 'image: %s\n' "$*"; }

# ---- build -----------------------------------------------------------------
if [[ -n "${BINARY:-}" ]]; then
    binary="$(realpath "$BINARY")"
else
    say "release build of outboxd"
    cargo build --release -p outboxd
    binary="$repo/target/release/outboxd"
fi
say "plugins"
bash scripts/build-plugins.sh >/dev/null

# ---- stage the root folder ---------------------------------------------------
say "staging $root"
rm -rf "$context"
mkdir -p "$root"/{usr/bin,etc/outboxd,etc/ssl/certs,tmp,"${plugins_in_image#/}"} "$context/data"
chmod 1777 "$root/tmp"
install -m 0755 "$binary" "$root/usr/bin/outboxd"
# The shared libraries the binary loads, at the paths the loader looks in
# (the dynamic loader itself included: `ldd` names it by absolute path).
ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u | while read -r lib; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done
if [[ ! -f /etc/ssl/certs/ca-certificates.crt ]]; then
    apt-get install -y ca-certificates >/dev/null
fi
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
cat >"$root/etc/passwd" <<PASSWD
root:x:0:0:root:/root:/usr/sbin/nologin
outboxd:x:$uid:$uid:outboxd:/var/lib/outboxd:/usr/sbin/nologin
PASSWD
cat >"$root/etc/group" <<GROUP
root:x:0:
outboxd:x:$uid:
GROUP
# Names resolve from /etc/hosts, then DNS (a compose service name).
echo "hosts: files dns" >"$root/etc/nsswitch.conf"
install -m 0644 deploy/image/outboxd.toml "$root/etc/outboxd/outboxd.toml"
shopt -s nullglob
for wasm in target/plugins/*.wasm; do
    name="$(basename "$wasm" .wasm)"
    install -m 0644 "$wasm" "$root$plugins_in_image/$name.wasm"
    manifest="plugins/$name/$name.toml"
    if [[ " ${disabled[*]} " == *" $name "* ]]; then
        install -m 0644 "$manifest" "$root$plugins_in_image/$name.toml.example"
    else
        install -m 0644 "$manifest" "$root$plugins_in_image/$name.toml"
    fi
done
cp deploy/image/Containerfile "$context/Containerfile"
say "staged: $(du -sh "$root" | cut -f1) ($(find "$root" -type f | wc -l) files)"
if $stage_only; then
    say "build it with: buildah bud --isolation chroot --format docker -t $image:$tag $context"
    exit 0
fi

# ---- build the image ---------------------------------------------------------
if ! command -v buildah >/dev/null 2>&1; then
    say "installing buildah (apt)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y buildah >/dev/null
fi
say "buildah bud"
buildah bud --isolation chroot --format docker --layers=false \
    -f "$context/Containerfile" -t "$image:$tag" -t "$image:latest" "$context"
size="$(buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' | awk -v want="$image:$tag" '$1 == want || $1 ~ ("/" want "$") { $1 = ""; print substr($0, 2); exit }')"
say "image $image:$tag built: ${size:-size unknown}"

# ---- smoke test --------------------------------------------------------------
ctr="$(buildah from --pull-never "$image:$tag")"
daemon_pid=""
# The processes below `pid`, deepest last: `buildah run` does not pass a
# signal on, so the daemon itself (the last of them) is the one stopped.
descendants() {
    local child
    for child in $(ps -o pid= --ppid "$1"); do
        echo "$child"
        descendants "$child"
    done
}
stop_daemon() {
    if [[ -n "$daemon_pid" ]] && kill -0 "$daemon_pid" 2>/dev/null; then
        local last
        last="$(descendants "$daemon_pid" | tail -n1)"
        kill -TERM "${last:-$daemon_pid}" 2>/dev/null || true
        wait "$daemon_pid" 2>/dev/null || true
    fi
    daemon_pid=""
}
cleanup() {
    stop_daemon
    buildah rm "$ctr" >/dev/null 2>&1 || true
}
trap cleanup EXIT
inside() { buildah run --isolation chroot "$@"; }

say "smoke: outboxd --version"
inside "$ctr" -- /usr/bin/outboxd --version

# A secret of the smoke test's own, for the manifests that read one: never
# part of the image.
smoke_secret="whsec_$(head -c 24 /dev/urandom | base64)"
plugin_env=(--env "OUTBOXD_WEBHOOK_SECRET=$smoke_secret" --env "OUTBOXD_AWARENESS_INGEST_SECRET=smoke")
for wasm in "$root$plugins_in_image"/*.wasm; do
    name="$(basename "$wasm" .wasm)"
    manifest="$plugins_in_image/$name.toml"
    [[ -f "$root$manifest" ]] || manifest="$manifest.example"
    say "smoke: outboxd plugin check $plugins_in_image/$name.wasm --manifest $manifest"
    inside "${plugin_env[@]}" "$ctr" -- /usr/bin/outboxd plugin check \
        "$plugins_in_image/$name.wasm" --manifest "$manifest" | tail -n 3
done

say "smoke: the daemon refuses to listen beyond loopback without an admin token"
if out="$(inside "$ctr" -- /usr/bin/outboxd run --migrate --listen "0.0.0.0:$port" 2>&1)"; then
    echo "$out" >&2
    say "FAILED: the daemon started on 0.0.0.0 without OUTBOXD_ADMIN__TOKEN"
    exit 1
fi
grep -q "admin.token" <<<"$out" || { echo "$out" >&2; say "FAILED: the refusal does not name admin.token"; exit 1; }
echo "refused: $(grep -o "configuration key .admin.token.*" <<<"$out" | head -n1)"

say "smoke: a daemon in the image, listening on 0.0.0.0:$port"
if curl -s -o /dev/null "http://127.0.0.1:$port/"; then
    say "FAILED: something already listens on port $port (set SMOKE_PORT)"
    exit 1
fi
token="$(head -c 32 /dev/urandom | base64 | tr -d '/+=')"
inside --env "OUTBOXD_ADMIN__TOKEN=$token" "${plugin_env[@]}" "$ctr" -- \
    /usr/bin/outboxd run --migrate --listen "0.0.0.0:$port" >"$repo/target/image/smoke-daemon.log" 2>&1 &
daemon_pid=$!
healthy=false
for _ in $(seq 1 120); do
    if inside "$ctr" -- /usr/bin/outboxd health --listen "127.0.0.1:$port" >/dev/null 2>&1; then
        healthy=true
        break
    fi
    if ! kill -0 "$daemon_pid" 2>/dev/null; then
        break
    fi
    sleep 0.5
done
if ! $healthy; then
    cat "$repo/target/image/smoke-daemon.log" >&2
    say "FAILED: no /health from the daemon in the image"
    exit 1
fi
daemon_uid="$(ps -o uid= -p "$(descendants "$daemon_pid" | tail -n1)" | tr -d ' ')"
echo "the daemon runs as uid $daemon_uid"
[[ "$daemon_uid" == "$uid" ]] || { say "FAILED: the daemon runs as uid $daemon_uid, not $uid"; exit 1; }
echo "health (outboxd health in the image): $(inside "$ctr" -- /usr/bin/outboxd health --listen "127.0.0.1:$port")"
echo "health (from the host): $(curl -fsS "http://127.0.0.1:$port/health")"
ready="$(curl -sS -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/ready")"
echo "ready: HTTP $ready, plugins loaded: $(curl -sS "http://127.0.0.1:$port/ready" | python3 -c 'import json,sys; print(json.load(sys.stdin)["checks"]["plugins"]["loaded"])')"
[[ "$ready" == 200 ]] || { cat "$repo/target/image/smoke-daemon.log" >&2; say "FAILED: /ready is $ready"; exit 1; }
admin="$(curl -sS -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/admin/sinks")"
with_token="$(curl -sS -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $token" "http://127.0.0.1:$port/v1/admin/sinks")"
echo "admin API: HTTP $admin without the token, HTTP $with_token with it"
[[ "$admin" == 401 && "$with_token" == 200 ]] || { say "FAILED: the admin API is not guarded by the token"; exit 1; }
stop_daemon
if grep -q "shutdown requested" "$repo/target/image/smoke-daemon.log"; then
    echo "stopped: $(grep -o 'shutdown requested.*' "$repo/target/image/smoke-daemon.log" | head -n1)"
fi
say "smoke test passed: $image:$tag, ${size:-size unknown} (staged root: $(du -sh "$root" | cut -f1))"

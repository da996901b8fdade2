#!/usr/bin/env bash
# One-time machine set-up for building and testing outboxd on Debian:
# the wasm32-wasip2 Rust target and the system packages the tests use.
# Safe to run again; it only installs what is missing.
set -euo pipefail

need_apt=()
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
if ((${#need_apt[@]})); then
    sudo_cmd=()
    [[ "$(id -u)" -eq 0 ]] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -q
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q "${need_apt[@]}"
fi

if ! rustup target list --installed | grep -qx wasm32-wasip2; then
    rustup target add wasm32-wasip2
fi

# Sourced by the end-to-end scripts: make sure the virtual environment of the
# end-to-end Python clients exists in target/e2e-venv with the packages
# pinned in tests/e2e/requirements.txt (re-created when that file changes,
# or when its scripts no longer run: target/ may be a build cache shared
# with a clone at another path, whose path the scripts' `#!` lines name).
# Expects `repo` (the repository root); sets `venv`.
venv="$repo/target/e2e-venv"
requirements="$repo/tests/e2e/requirements.txt"
stamp="$venv/.requirements"

if ! cmp -s "$requirements" "$stamp" 2>/dev/null || ! "$venv/bin/pip" --version >/dev/null 2>&1; then
    if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        # Debian splits venv support out of python3.
        sudo_cmd=()
        [[ "$(id -u)" -eq 0 ]] || sudo_cmd=(sudo)
        "${sudo_cmd[@]}" apt-get update -q
        DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q python3-venv
    fi
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$stamp"
fi

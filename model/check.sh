#!/usr/bin/env bash
# Model-check outboxd's delivery protocol (model/outboxd.pml) with spin:
# every property exhaustively at the bounds below, then every mutant, which
# must produce a counterexample trail that breaks the property it targets.
# Exits non-zero when a property fails, a search is incomplete (depth or
# memory), or a mutant is not caught. See model/README.md.
#
# Environment: MODEL_MEMLIM_MB (default 2000) caps each search's memory;
# MODEL_KEEP=1 keeps the work folder (trails) and prints its path;
# MODEL_FULL=1 adds the larger searches (three workers with replay, two
# streams under liveness); MODEL_JOBS (default: the number of CPUs) is how
# many searches run at once (each is one process; compiling its verifier
# takes most of a small search's time).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v spin >/dev/null 2>&1 ||
    { echo "model/check.sh: spin is not installed; run scripts/setup.sh (Debian package spin)" >&2; exit 2; }
command -v gcc >/dev/null 2>&1 ||
    { echo "model/check.sh: gcc is not installed; run scripts/setup.sh (build-essential)" >&2; exit 2; }

mem="${MODEL_MEMLIM_MB:-2000}"
depth=300000
work="$(mktemp -d "${TMPDIR:-/tmp}/outboxd-model.XXXXXX")"
# Searches still running when the script ends (a failure, a signal) are
# stopped with it.
kill_tree() { local c; for c in $(pgrep -P "$1"); do kill_tree "$c"; done; kill "$1" 2>/dev/null || true; }
stop_searches() { local p; for p in $(jobs -p); do kill_tree "$p"; done; }
if [[ "${MODEL_KEEP:-0}" == 1 ]]; then
    echo "model/check.sh: work folder $work"
    trap 'stop_searches' EXIT
else
    trap 'stop_searches; rm -rf "$work"' EXIT
fi
trap 'exit 130' INT TERM
failures=0

# run_check NAME MODE EXPECT [-DNAME=VALUE ...]
#   MODE   safety (assertions, invalid end states) or liveness (never
#          claim `nothing_lost`, weak fairness; assertions too)
#   EXPECT pass, or fail:PROP (an assertion marked `prop: PROP` fails) or
#          fail:cycle (an acceptance cycle: something is never delivered)
run_check() {
    local name="$1" mode="$2" expect="$3"
    shift 3
    local dir="$work/$name"
    mkdir -p "$dir"
    cp "$here/outboxd.pml" "$dir/"
    local defs=("$@")
    local cflags=(-O2 -DMEMLIM="$mem" -DCOLLAPSE) run=(./pan -m"$depth")
    if [[ "$mode" == liveness ]]; then
        defs+=(-DLIVENESS)
        cflags+=(-DNFAIR=3)
        run+=(-a -f)
    else
        cflags+=(-DSAFETY)
    fi
    local started=$SECONDS
    (cd "$dir" && spin "${defs[@]}" -a outboxd.pml >spin.out 2>&1 && gcc "${cflags[@]}" -o pan pan.c >gcc.out 2>&1) ||
        { echo "FAIL $name: the model does not compile:"; cat "$dir/spin.out" "$dir/gcc.out" 2>/dev/null | tail -n 20; return 1; }
    (cd "$dir" && "${run[@]}" >pan.out 2>&1) || true
    local took=$((SECONDS - started))
    local errors states
    errors="$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' "$dir/pan.out" | tail -n1)"
    states="$(sed -n 's/^ *\([0-9.e+]*\) states, stored.*/\1/p' "$dir/pan.out" | tail -n1)"
    local bounds="${*:-defaults}"
    if [[ -z "$errors" ]]; then
        echo "FAIL $name ($mode; $bounds): the search did not finish:"; tail -n 20 "$dir/pan.out"
        return 1
    fi
    if [[ "$expect" == pass ]]; then
        if [[ "$errors" != 0 ]]; then
            echo "FAIL $name ($mode; $bounds): counterexample found:"
            grep -E '^pan:' "$dir/pan.out" | head -n 5
            (cd "$dir" && spin -t "${defs[@]}" outboxd.pml 2>&1 | tail -n 40)
            return 1
        fi
        if grep -qE 'max search depth too small|out of memory|Search not completed' "$dir/pan.out"; then
            echo "FAIL $name ($mode; $bounds): the search was not exhaustive:"
            grep -E 'max search depth too small|out of memory|Search not completed' "$dir/pan.out" | head -n 3
            return 1
        fi
        echo "ok   $name ($mode; $bounds): $states states, ${took}s"
        return
    fi
    # A mutant: there must be a trail, spin must replay it, and it must
    # break the property the mutant targets.
    local want="${expect#fail:}"
    if [[ "$errors" == 0 || ! -f "$dir/outboxd.pml.trail" ]]; then
        echo "FAIL $name ($mode; $bounds): the mutant was not caught (no counterexample)"
        return 1
    fi
    local replay got=""
    replay="$(cd "$dir" && spin -t "${defs[@]}" outboxd.pml 2>&1 || true)"
    if [[ "$want" == cycle ]]; then
        grep -q 'acceptance cycle' "$dir/pan.out" && grep -q 'START OF CYCLE' <<<"$replay" && got=cycle
    else
        local line
        line="$(sed -n 's/.*outboxd\.pml:\([0-9]*\), Error: assertion violated.*/\1/p' <<<"$replay" | head -n1)"
        [[ -n "$line" ]] && got="$(sed -n "${line}p" "$dir/outboxd.pml" | sed -n 's/.*prop: \([a-z]*\).*/\1/p')"
    fi
    if [[ "$got" != "$want" ]]; then
        echo "FAIL $name ($mode; $bounds): expected a counterexample to '$want', got '${got:-none}':"
        grep -E '^pan:' "$dir/pan.out" | head -n 3
        return 1
    fi
    local steps
    steps="$(sed -n 's/.*trail ends after \([0-9]*\) steps.*/\1/p' <<<"$replay" | head -n1)"
    echo "ok   $name ($mode; $bounds): counterexample to '$want' as expected (trail of ${steps:-?} steps), ${took}s"
}

# check NAME ...: run_check in the background, at most $jobs at once; its
# report is printed, in the order the checks are listed, once all are done.
jobs="${MODEL_JOBS:-$(nproc 2>/dev/null || echo 1)}"
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] ||
    { echo "model/check.sh: MODEL_JOBS must be a whole number of at least 1, not '$jobs'" >&2; exit 2; }
names=()
check() {
    local name="$1"
    names+=("$name")
    while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
    (if run_check "$@" >"$work/$name.report" 2>&1; then echo 0; else echo 1; fi >"$work/$name.status") &
}

# Properties, exhaustively. Defaults (outboxd.pml): NS=2 streams, NE=2
# events per stream, NW=2 workers, MAXCRASH=1, MAXSLOW=1 (a lease running
# out under a live worker), MAXATT=2, REPLAYS=1, sink A on-dead = move-on,
# sink B chained after A.
one="-DNS=1"
check move-on            safety   pass "$one"
check move-on-live       liveness pass "$one" -DREPLAYS=0
check block              safety   pass "$one" -DBLOCK_A=1
check block-live         liveness pass "$one" -DBLOCK_A=1
check three-workers      safety   pass "$one" -DNW=3 -DREPLAYS=0
check two-streams        safety   pass -DNS=2 -DNE=1
if [[ "${MODEL_FULL:-0}" == 1 ]]; then
    # Larger searches, a few minutes more: MODEL_FULL=1 bash model/check.sh
    check three-workers-replay safety   pass "$one" -DNW=3
    check move-on-replay-live  liveness pass "$one"
    check two-streams-live     liveness pass -DNS=2 -DNE=1
fi
check three-events       safety   pass "$one" -DNE=3 -DMAXCRASH=0 -DMAXSLOW=0 -DREPLAYS=0

# Mutants: each must be caught, on the property it breaks.
check no-fence           safety   fail:fence "$one" -DNO_FENCE
check no-head-check      safety   fail:order "$one" -DNO_HEAD_CHECK
check no-block-head      safety   fail:order "$one" -DBLOCK_A=1 -DNO_BLOCK_HEAD_CHECK
check no-after-check     safety   fail:chain "$one" -DNO_AFTER_CHECK
check no-head-lock       liveness fail:cycle "$one" -DREPLAYS=0 -DNO_HEAD_LOCK
# Not a mutant: without the documented waits (behind a blocking dead
# letter, or behind an event the `after` sink dead-lettered) some event
# would never end; this shows those waits are real, not vacuous.
check strict-liveness    liveness fail:cycle "$one" -DREPLAYS=0 -DBLOCK_A=1 -DSTRICT_LIVENESS

wait
for name in "${names[@]}"; do
    cat "$work/$name.report"
    [[ "$(cat "$work/$name.status" 2>/dev/null)" == 0 ]] || failures=$((failures + 1))
done

if ((failures > 0)); then
    echo "model/check.sh: $failures check(s) failed" >&2
    exit 1
fi
echo "model/check.sh: all checks passed"

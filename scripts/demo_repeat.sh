#!/usr/bin/env bash
# Run the demo (`tally demo`) N times, each from a fresh `git clone` of the repository, print each
# run's verification line and a summary table, and exit non-zero if any run did not verify.
#
#   scripts/demo_repeat.sh [N]          # N defaults to 10
#
# Environment:
#   REPO       repository to clone (default: the one holding this script)
#   REF        commit-ish to check out in every clone (default: HEAD; resolved once, so every
#              run tests the same commit even if the branch moves meanwhile)
#   PYTHON     a Python with Tally's dependencies (default: .venv/bin/python of this checkout,
#              which `make demo` creates); each clone runs with PYTHONPATH at the clone, so the
#              clone's code is what runs, not the checkout the venv was installed from
#   DEMO_ARGS  extra arguments for `tally demo`, e.g. "--zookeeper 127.0.0.1:2181"
#   KEEP       1 keeps every run's clone and data (default: only failed runs' are kept)
#
# Every run's full output is kept in <work dir>/run-<i>.log (the work dir is printed first).
set -u -o pipefail

N=${1:-10}
if ! [[ "$N" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [N]   (N: a positive number of runs, default 10)" >&2
    exit 2
fi
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPO=${REPO:-$HERE}
REF=${REF:-HEAD}
PYTHON=${PYTHON:-$HERE/.venv/bin/python}
DEMO_ARGS=${DEMO_ARGS:-}
KEEP=${KEEP:-0}

if [ ! -x "$PYTHON" ]; then
    echo "no Python at $PYTHON: run 'make demo' once (it creates .venv), or set PYTHON" >&2
    exit 2
fi
if ! command -v java >/dev/null 2>&1; then
    echo "no java on PATH: run 'bash scripts/setup.sh openjdk-17-jre-headless' (make demo does)" >&2
    exit 2
fi
COMMIT=$(git -C "$REPO" rev-parse --verify "$REF^{commit}") || exit 2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tally-demo-repeat-XXXXXX")
echo "demo x$N: $REPO at $(git -C "$REPO" log -1 --format='%h %s' "$COMMIT" | cut -c1-100)"
echo "python $PYTHON; logs and clones in $WORK"

results=()
seconds=()
lines=()
failed=0
for i in $(seq 1 "$N"); do
    run="$WORK/run-$i"
    clone="$run/tally"
    log="$WORK/run-$i.log"
    mkdir -p "$run/tmp"
    start=$(date +%s%N)
    result=FAIL
    line=""
    if git clone -q "$REPO" "$clone" >"$log" 2>&1 && git -C "$clone" checkout -q "$COMMIT" >>"$log" 2>&1; then
        # The clone's packages must shadow the venv's editable install of the original checkout.
        where=$(cd "$clone" && PYTHONPATH="$clone" "$PYTHON" -c \
            'import os, tally, sink; print(os.path.dirname(os.path.dirname(tally.__file__)))' 2>>"$log")
        if [ "$where" != "$clone" ]; then
            echo "the demo would not run the clone's code (imports from '$where')" >>"$log"
        else
            # TMPDIR: the demo's own work dir (cluster, source files, checkpoint) lands in the run's
            # directory, new and empty, and goes away with it.
            (cd "$clone" && env TMPDIR="$run/tmp" PYTHONPATH="$clone" PYSPARK_PYTHON="$PYTHON" \
                PYSPARK_DRIVER_PYTHON="$PYTHON" "$PYTHON" -m tally.cli.main demo $DEMO_ARGS) >>"$log" 2>&1
            code=$?
            line=$(grep -E "every row is exact|VERIFICATION FAILED" "$log" | tail -1 | sed 's/^ *//')
            if [ $code -eq 0 ] && [[ "$line" == "every row is exact"* ]]; then
                result=PASS
            else
                line="${line:-no verification line} (exit code $code)"
            fi
        fi
    else
        line="git clone of $REPO failed"
    fi
    end=$(date +%s%N)
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", (b - a) / 1e9 }')
    [ -z "$line" ] && line="(see $log)"
    results+=("$result")
    seconds+=("$secs")
    lines+=("$line")
    echo "run $i/$N: $result in ${secs}s | $line"
    if [ "$result" = PASS ]; then
        [ "$KEEP" = 1 ] || rm -rf "$run"
    else
        failed=$((failed + 1))
        echo "  full output: $log; clone and data kept in $run"
        grep -E "MISMATCH|NOT THE PLANNED|CRASH NOT AS PLANNED|Traceback|Error" "$log" | head -5 | sed 's/^/  | /'
    fi
done

echo
printf '%-5s %-6s %8s\n' run result seconds
for i in $(seq 1 "$N"); do
    printf '%-5s %-6s %8s\n' "$i" "${results[$((i - 1))]}" "${seconds[$((i - 1))]}"
done
echo "$((N - failed))/$N runs verified exactly (commit ${COMMIT:0:12})"
[ "$failed" -eq 0 ]

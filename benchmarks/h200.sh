#!/usr/bin/env bash
# On the H200 (the `device` tool, which reaches no package index): install the wheelhouse carried in .whl/,
# then run the GPU tests and named sweeps (conf/experiment/*.yaml). Logs and outputs.tgz go to $OUT.
#   bash benchmarks/h200.sh [tests] PRESET...        e.g.  bash benchmarks/h200.sh tests design-card
# A step `cold:PRESET` runs only the preset's compiled jobs (mode=compiled), which fills the compile cache, so that
# a later `PRESET` step is the preset warm. The compile cache lives in /tmp/harness-cache: the device copies the
# work tree afresh for each call, and a cache inside it would be gone at the next one.
#
# A run longer than one call (10 minutes) goes detached: `--detach SECONDS STEP...` starts the steps in a process
# of their own session (it outlives the call, as long as the machine is held), then reports for SECONDS and packs
# what is done. A next call, within the machine's idle time, `--detach SECONDS` alone, waits on the same run:
#   bash benchmarks/h200.sh --detach 560 cold:models models     # then, at once:  bash benchmarks/h200.sh --detach 560
# The device may replace the machine between any two calls, even when the next call comes at once (seen on
# 2026-12-04: the detached run and its cache were gone): keep a measurement inside one call where it fits, and
# reach for --detach only where it cannot.
# The device takes at most 64 MiB of work tree and carried wheels together, and the tree alone is about 27 MiB with
# its result folders (2026-12-04): the wheelhouse of ../shared/device/wheels.sh (35 MiB) was refused beside it. Its
# mlflow wheel carries the UI's build (8 MB), which no GPU run needs; without it the wheelhouse is 28 MiB:
#   d=$(mktemp -d) && (cd $d && unzip -q "$OLDPWD"/.whl/mlflow-3*.whl && rm -rf mlflow/server/js/build &&
#     sed -i '/^mlflow\/server\/js\/build\//d' mlflow-*.dist-info/RECORD && rm "$OLDPWD"/.whl/mlflow-3*.whl &&
#     zip -qr "$OLDPWD"/.whl/mlflow-3.17.2-py3-none-any.whl .)
# On 2026-12-06 the tree was 32 MiB and that was still too much: the server's own wheels, which no run imports (a
# sweep logged to MLflow and a GPU test ran without them), came out too, for 26.6 MiB:
#   rm .whl/{docker,gunicorn,huey,skops,graphql_core,graphene}-*.whl
# On 2026-12-07 the tree was 32.9 MiB and the 26.6 MiB wheelhouse was refused beside it. These, which a sweep does not
# import (PYTHONPROFILEIMPORTTIME=1 over a CPU sweep that logged to MLflow), came out too, for 25.0 MiB, accepted:
#   rm .whl/{wcwidth,prettytable,flask,flask_cors,uvicorn,gitpython,gitdb,smmap,itsdangerous,blinker}-*.whl
#   rm .whl/pyasn1{,_modules}-*.whl
# A shell is needed only for the wheelhouse; each sweep is `python -m harness -m +experiment=PRESET`.
set -u
RUN=/tmp/h200-run  # a detached run's steps, logs and progress
out=${OUT:-.}
running() { pgrep -f "benchmarks/h200.sh --in-run" >/dev/null; }  # whether a detached run's process is alive
if [ "${1:-}" = --detach ]; then
  seconds=${2:?--detach SECONDS [STEP...]}; shift 2; started=$(date +%s)
  if [ $# -gt 0 ] && ! running; then
    rm -rf "$RUN" && mkdir -p "$RUN" && cp -r . "$RUN/tree" && rm -rf "$RUN/tree/.git"  # the tree of this call
    (cd "$RUN/tree" && setsid nohup bash benchmarks/h200.sh --in-run "$@" > "$RUN/run.log" 2>&1 < /dev/null &)
  fi
  # A fresh machine (the last one went back when idle) has no run to wait on: say so at once, not after SECONDS.
  [ -d "$RUN" ] || { echo "h200.sh: no detached run on this machine ($RUN is missing): it was started on one given back since"; exit 1; }
  while [ $(( $(date +%s) - started )) -lt "$seconds" ] && ! grep -q " all done" "$RUN/progress" 2>/dev/null; do
    sleep 5  # first, so that a run started just now has exec'd before it is looked for
    grep -q " all done" "$RUN/progress" 2>/dev/null || running ||
      { echo "h200.sh: the detached run ended before it was all done"; break; }
  done
  cat "$RUN/progress" 2>/dev/null; tail -20 "$RUN/run.log" 2>/dev/null
  tar czf "$out/outputs.tgz" -C "$RUN" progress run.log \
    $(cd "$RUN" && ls -d tree/outputs tree/mlruns tree/*.log tree/machine.txt 2>/dev/null)
  exit 0
fi
in_run=false; [ "${1:-}" = --in-run ] && { in_run=true; out=.; shift; }
note() { $in_run && echo "$(date -u +%T) $*" >> "$RUN/progress"; }
OUT=$out; source benchmarks/device_steps.sh  # the wheelhouse installed, the machine written to $out/machine.txt
for step in "$@"; do
  note "start $step"
  if [ "$step" = tests ]; then
    python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu > "$out/gpu_tests.log" 2>&1; rc=$?
    tail -5 "$out/gpu_tests.log"
  else
    preset=${step#cold:}; only=(); log="$out/$preset.log"
    if [ "$step" != "$preset" ]; then only=(mode=compiled); log="$out/$preset-cold.log"; fi  # its compiled jobs alone
    [ -e "$log" ] && log="${log%.log}-again.log"  # a preset run twice (cold, then warm) keeps both logs
    python3 -m harness -m "+experiment=$preset" "${only[@]}" > "$log" 2>&1; rc=$?
    grep -v '^\[harness\]' "$log" | tail -40
  fi
  note "end $step (exit $rc)"
done
note "all done"
$in_run || tar czf "$out/outputs.tgz" outputs mlruns

# A device call's first lines, sourced by the call's own script (kept beside its outputs under docs/results/) and by
# benchmarks/h200.sh:
#   BUDGET=560; source benchmarks/device_steps.sh
#   step pairs 90 python3 benchmarks/fused_variants.py --variant attention_programs=128 model=...   # NAME, seconds it needs, command
# It installs the wheelhouse carried in .whl/ (the device reaches no package index; benchmarks/h200.sh says how to
# build it), writes the machine's GPU, driver and versions to $OUT/machine.txt, and defines:
#   left: seconds left of BUDGET, counted from the source;
#   step NAME NEED CMD...: CMD with its output appended to $OUT/NAME.txt, cut off 5 s before the budget ends, and
#     skipped (returning 1) when fewer than NEED seconds are left, so that a call packs what it has before its limit.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
  { echo "device_steps.sh: the wheelhouse in .whl/ did not install (pip's reason above)"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=${HARNESS_CACHE_DIR:-/tmp/harness-cache}
OUT=${OUT:-.}
device_start_s=$(date +%s)
left() { echo $(( ${BUDGET:-560} - ($(date +%s) - device_start_s) )); }
step() {
  local name=$1 need=$2 t0 rc; shift 2
  if [ "$(left)" -lt "$need" ]; then echo "SKIP $name ($(left)s left, $need needed)"; return 1; fi
  echo "== $*" >> "$OUT/$name.txt"; t0=$(date +%s)
  timeout $(( $(left) - 5 )) "$@" >> "$OUT/$name.txt" 2>&1; rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s"; return $rc
}
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.max.sm --format=csv
  python3 -c "import torch, triton, transformers as t; print(torch.__version__, triton.__version__, t.__version__)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

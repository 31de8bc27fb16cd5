set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export HARNESS_CACHE_DIR=/tmp/harness-cache TRITON_CACHE_DIR=/tmp/triton-cache
{ nvidia-smi --query-gpu=uuid,name,driver_version --format=csv,noheader; date -u; } | tee $OUT/machine.txt
kernels() { name=$1; rows=$2; shift 2; echo "== $name $(date -u +%T)" >> $OUT/machine.txt
  timeout 90 python -c "
import sys; sys.path.insert(0, 'benchmarks')
import fused_kernels
from harness.kernels import fused_decode
fused_decode.MLP_IN_ONE_MAX_ROWS = $rows
fused_kernels.main(sys.argv[1:])" "$@" > $OUT/$name.txt 2>&1; echo "rc=$?" >> $OUT/$name.txt; tail -12 $OUT/$name.txt; }
L="model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127 fused.pdl=false"
Q="model=qwen3-0.6b bs=1 context_len=1024 fused.pdl=false"
kernels k_llama_default 0 $L
kernels k_llama_mlp 8 $L
kernels k_qwen_default 0 $Q
kernels k_qwen_mlp 8 $Q
echo "== tests $(date -u +%T)" >> $OUT/machine.txt
timeout 330 python -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py -k "mlp_in_one or qkvs_tail or loaded_from_disk" > $OUT/tests.txt 2>&1; echo "rc=$?" >> $OUT/tests.txt
tail -15 $OUT/tests.txt; date -u >> $OUT/machine.txt

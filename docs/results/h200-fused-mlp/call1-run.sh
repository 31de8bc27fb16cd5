set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
export HARNESS_CACHE_DIR=/tmp/harness-cache TRITON_CACHE_DIR=/tmp/triton-cache
{ nvidia-smi --query-gpu=uuid,name,driver_version --format=csv,noheader; date -u; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; } | tee $OUT/machine.txt
run() { name=$1; limit=$2; shift 2; echo "== $name $(date -u +%T)" | tee -a $OUT/machine.txt; timeout $limit python benchmarks/fused_prefetch.py "$@" > $OUT/$name.txt 2>&1; echo "rc=$? $(date -u +%T)" >> $OUT/$name.txt; tail -12 $OUT/$name.txt; }
run mlp_llama 210 --set mlp model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127
run mlp_qwen 170 --set mlp model=qwen3-0.6b bs=1 context_len=1024
run qkv_llama 150 --set into_qkv model=llama-3.2-1b bs=1 context_len=32 cache_len=16384 decode_tokens=127

#!/usr/bin/env bash
# One prepared GPU session for serving (issue 14): the serving tests with their CUDA cases, then
# benchmarks/serve/serve_load.py with the model on the GPU. Installs nothing from a registry: the serve
# extra's wheels come in .whl/ (downloaded as gpu_paropt.sh's header shows for optuna's); results land in $OUT.
#
#   OUT=/tmp/out bash benchmarks/gpu_serve_check.sh       # ~5 minutes on an H200 (+2 with CUDA_TESTS=1)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
PY=${PY:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
  $PY -c "import torch, fastapi, uvicorn, aiohttp; print('torch', torch.__version__, torch.version.cuda, 'fastapi', fastapi.__version__, 'uvicorn', uvicorn.__version__, 'aiohttp', aiohttp.__version__)"; } > "$OUT/gpu.txt" 2>&1

# 1. The serving tests, CUDA cases included (the Redis ones skip: no redis-server there).
timeout 150 $PY -m pytest -q -p no:cacheprovider -rs tests/test_serve_batcher.py tests/test_serve_http.py \
    tests/test_serve_consistency.py > "$OUT/serve_tests.txt" 2>&1
echo "serve tests exit $?" >> "$OUT/serve_tests.txt"

# 2. Load on the GPU: the DIGINETICA-size synthetic model (built here on the CPU), stateful and
#    stateless, concurrency 1-128, batching on and off back to back.
timeout 300 $PY -m benchmarks.serve.serve_load --device cuda --requests 2000 --seconds 10 --repeats 3 \
    --concurrency 1 8 32 128 > "$OUT/serve_load_cuda.jsonl" 2> "$OUT/serve_load_cuda.err"
echo "serve_load exit $?" >> "$OUT/serve_load_cuda.err"

# 3. If time is left (CUDA_TESTS=1): the training contract tests' CUDA cases.
if [ "${CUDA_TESTS:-0}" = 1 ]; then
  timeout 120 $PY -m pytest -q -p no:cacheprovider -x -k "cuda" tests/test_train.py tests/test_step_reference.py \
      tests/test_precision.py > "$OUT/cuda_tests.txt" 2>&1
  echo "cuda tests exit $?" >> "$OUT/cuda_tests.txt"
fi
ls -la "$OUT"

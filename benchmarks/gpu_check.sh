#!/usr/bin/env bash
# One prepared GPU session: the CUDA contract tests, then the training and evaluation benchmarks.
# Installs nothing heavy (the GPU machine brings its own CUDA torch); every result lands in $OUT.
#
#   OUT=/tmp/out bash benchmarks/gpu_check.sh            # ~6-8 minutes on an H200
#   OUT=/tmp/out PORT=.port bash benchmarks/gpu_check.sh   # + the official port (a copy in .port/), same GPU
#
# What it answers (issue 4): do the fast path and CUDA-graph replay give the reference losses on
# CUDA; mini-batches/s of the retailrocket configuration (target >= 10,000 mb/s); how speed falls
# with batch and layer size (compute-bound, not flat); what mixed precision gains; evaluation FLOP/s.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
PY=${PY:-python}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; $PY -c "import torch; print(torch.__version__, torch.version.cuda)"; } > "$OUT/gpu.txt" 2>&1

# 1. Contract tests on CUDA (the CPU suite runs in CI; here only what has a CUDA parameter).
timeout 240 $PY -m pytest -q -x -k "cuda" tests/test_train.py tests/test_step_reference.py tests/test_cli.py tests/test_precision.py \
    > "$OUT/cuda_tests.txt" 2>&1
echo "cuda tests exit $?" >> "$OUT/cuda_tests.txt"

DATA=../shared/data
RR="--config retailrocket --device cuda --steps 2000 --warmup 200 --repeats 3"
# 2. The headline figure, with and without CUDA-graph replay, on synthetic data (RetailRocket-sized catalogue).
timeout 120 $PY benchmarks/train_speed.py $RR --n-items 50000 > "$OUT/train_retailrocket.jsonl" 2>>"$OUT/errors.txt"
GRU4REC_CUDA_GRAPHS=0 timeout 120 $PY benchmarks/train_speed.py $RR --n-items 50000 > "$OUT/train_retailrocket_eager.jsonl" 2>>"$OUT/errors.txt"
# 3. Sweep: batch 32..256 x layers 100..512 x {cross-entropy, bpr-max}.
timeout 180 $PY benchmarks/train_speed.py --config retailrocket --device cuda --sweep --steps 500 --warmup 100 --repeats 3 \
    --n-items 50000 > "$OUT/train_sweep.jsonl" 2>>"$OUT/errors.txt"
# 4. Mixed precision against float32: retailrocket (224 units) and the 512-unit diginetica configuration.
timeout 90 $PY benchmarks/train_speed.py $RR --n-items 50000 --precision bfloat16 --compare-precision > "$OUT/train_retailrocket_bfloat16.jsonl" 2>>"$OUT/errors.txt"
timeout 90 $PY benchmarks/train_speed.py --config diginetica --device cuda --steps 1000 --warmup 100 --repeats 3 \
    --n-items 43097 --precision bfloat16 --compare-precision > "$OUT/train_diginetica_bfloat16.jsonl" 2>>"$OUT/errors.txt"
# 5. Evaluation on DIGINETICA (if the shared data is there).
if [ -d "$DATA/diginetica_srgnn" ]; then
  timeout 120 $PY benchmarks/eval_speed.py --device cuda --batch-size 512 2048 4096 > "$OUT/eval_speed.jsonl" 2>>"$OUT/errors.txt"
fi
# 6. Against the official PyTorch port on this GPU, if a copy is given (PORT=folder with its
#    gru4rec_pytorch.py; not part of this project): retailrocket configuration, synthetic data.
if [ -n "${PORT:-}" ] && [ -f "$PORT/gru4rec_pytorch.py" ]; then
  $PY -m gru4rec.cli synth "$OUT/synth" --n-sessions 60000 --n-items 50000 -f > /dev/null 2>>"$OUT/errors.txt"
  timeout 240 $PY benchmarks/port_compare.py --port "$PORT" --device cuda --config retailrocket \
      --data "$OUT/synth/train_full.tsv" --epochs 2 --rounds 1 > "$OUT/port_compare.jsonl" 2>>"$OUT/errors.txt"
  rm -rf "$OUT/synth"
fi
ls -la "$OUT"

#!/usr/bin/env bash
# One prepared GPU session for the fused GPU kernels (Triton): correctness on CUDA, kernels per
# step, and what run.py gets with and without them. Installs nothing (the GPU machine brings its
# CUDA torch and Triton); every result lands in $OUT. About 6-7 minutes on an H200.
#
# Before (on the development machine), the real data as gzipped copies in the ignored .gpu_data/:
#   mkdir -p .gpu_data && for f in train_full test; do gzip -c ../shared/data/diginetica_srgnn/$f.tsv > .gpu_data/diginetica_$f.tsv.gz; done
# Then, with the device tool: command "OUT=\$OUT bash benchmarks/gpu_check.sh", carry [".gpu_data"].
#
# What it answers (issue 27): do the Triton kernels give the PyTorch step's numbers on CUDA (tests,
# then epoch losses of run.py on DIGINETICA, fused against unfused); how many kernels and device
# microseconds a step takes in each backend; mini-batches/s of the retailrocket configuration
# (target >= 10,000) and the DIGINETICA configuration (target >= 6,000); and whether the tuned
# DIGINETICA file keeps its test Recall@20/MRR@20 (0.5424/0.1825 +- 0.003) with the fused kernels.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
PY=${PY:-python}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
DATA=${DATA:-.gpu_data}
TRAIN=$DATA/diginetica_train_full.tsv.gz
TEST=$DATA/diginetica_test.tsv.gz
RR="loss=bpr-max,final_act=elu-0.5,constrained_embedding=True,embedding=0,layers=224,batch_size=80,dropout_p_embed=0.5,dropout_p_hidden=0.05,learning_rate=0.05,momentum=0.4,n_sample=2048,sample_alpha=0.4,bpreg=1.95,logq=0.0,adapt=adagrad,n_epochs=3"
DG="loss=bpr-max,final_act=elu-1,constrained_embedding=True,embedding=0,layers=512,batch_size=128,dropout_p_embed=0.5,dropout_p_hidden=0.3,learning_rate=0.05,momentum=0.15,n_sample=2048,sample_alpha=0.3,bpreg=0.9,logq=0.0,adapt=adagrad,n_epochs=3"

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"; } > "$OUT/gpu.txt" 2>&1

# 1. Kernels and device time per step, and graph-replayed microseconds per step, both backends.
timeout 60 $PY -m benchmarks.gpu.gpu_profile --config retailrocket --n-items 50000 > "$OUT/profile_retailrocket.jsonl" 2>>"$OUT/errors.txt"
timeout 60 $PY -m benchmarks.gpu.gpu_profile --config diginetica --n-items 43097 > "$OUT/profile_diginetica.jsonl" 2>>"$OUT/errors.txt"

# 2. run.py on DIGINETICA's train_full, 3 epochs: unfused, then fused (epoch lines: loss and mb/s).
if [ -f "$TRAIN" ]; then
  for cfg in RR DG; do
    timeout 75 $PY run.py "$TRAIN" -ps "${!cfg}" -d cuda > "$OUT/run_${cfg}_torch.txt" 2>&1
    GRU4REC_FUSED=1 timeout 75 $PY run.py "$TRAIN" -ps "${!cfg}" -d cuda > "$OUT/run_${cfg}_triton.txt" 2>&1
  done
  # 3. The tuned DIGINETICA file with the fused kernels: 10 epochs and the full test evaluation.
  GRU4REC_FUSED=1 timeout 100 $PY run.py "$TRAIN" -pf paramfiles/diginetica_srgnn_bprmax_best.py -t "$TEST" -m 20 -d cuda \
      > "$OUT/run_tuned_triton.txt" 2>&1
fi
# 4. mini-batches/s of whole epochs, both backends interleaved (synthetic data, retailrocket configuration).
timeout 60 $PY -m benchmarks.train.train_speed --config retailrocket --device cuda --n-items 50000 --steps 3000 --repeats 3 --compare-fused \
    > "$OUT/train_speed_fused.jsonl" 2>>"$OUT/errors.txt"
# 5. The kernels and the backend on CUDA (each test file picks CUDA tensors when a GPU is there);
#    last, since compiling every tested variant takes minutes: what it reaches is in the file.
timeout 150 $PY -m pytest -q -x -p no:cacheprovider tests/test_triton_gru.py tests/test_triton_losses.py tests/test_triton_optim.py \
    tests/test_triton_step.py tests/test_backend.py > "$OUT/triton_tests.txt" 2>&1
echo "triton tests exit $?" >> "$OUT/triton_tests.txt"

grep -h "Epoch\|Recall\|MRR" "$OUT"/run_*.txt > "$OUT/summary.txt" 2>/dev/null
ls -la "$OUT"

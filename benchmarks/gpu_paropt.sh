#!/usr/bin/env bash
# One prepared GPU window of tuning (issue 29): paropt on a wide space for at most MINUTES (default
# 8) of wall-clock time, continuing the study in results/studies/<study>.journal; results in $OUT.
#
#   bash benchmarks/gpu_paropt.sh DATASET [LOSS] [more benchmarks/gpu/gpu_paropt.py options]
#   DATASET: diginetica | tmall | rsc15;  LOSS: bprmax (default) | xe
#
# Before (on the development machine, from the project root):
#   the data, gzipped, in the ignored .gpu_data/ (one command; every data set and split it needs):
#     mkdir -p .gpu_data && for d in diginetica:diginetica_srgnn tmall:tmall_srgnn rsc15:rsc15_100k; do for s in train_tr train_valid; do gzip -c ../shared/data/${d#*:}/$s.tsv > .gpu_data/${d%%:*}_$s.tsv.gz; done; done
#   optuna and the packages it needs that the GPU machine lacks, as wheels in the ignored .whl/
#   (the machine has Python 3.12 and no network; /work/.library/device/README.md):
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl optuna==5.1.0 alembic==1.20.1 sqlalchemy==2.1.9 colorlog==6.12.0 mako==1.4.3
#   (numpy, packaging, pyyaml, tqdm, markupsafe and typing-extensions are there already)
# Then, with the device tool: command "bash benchmarks/gpu_paropt.sh diginetica", carry
# [".gpu_data", ".whl"], timeout_s 560. Afterwards commit $OUT/<study>.journal over
# results/studies/<study>.journal and $OUT/<study>.{trials.csv,trials.json,best.json,best.py,summary.json}
# into results/: the next window, on any GPU, continues the same study.
#
# Installs only the wheels of .whl/ (into /tmp/site), nothing else: torch and CUDA come with the
# machine. Without $OUT (a CPU check) the journal in results/studies/ and the reports in results/
# are updated in place.
set -uo pipefail
cd "$(dirname "$0")/.."
DATASET=${1:?usage: gpu_paropt.sh DATASET [LOSS] [options]}
shift
LOSS=bprmax
if [ $# -gt 0 ] && [[ $1 != -* ]]; then LOSS=$1; shift; fi
MINUTES=${MINUTES:-8}
PY=${PY:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

if ! $PY -c "import optuna" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=$PYTHONPATH:/tmp/site
  else
    echo "gpu_paropt.sh: optuna is not installed and .whl/ holds no wheels (see the header)" >&2
    exit 1
  fi
fi
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  { command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    $PY -c "import torch, optuna; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'optuna', optuna.__version__)"; } \
    > "$OUT/gpu.txt" 2>&1
  LOG="$OUT/paropt.log"
else
  LOG=/dev/null
fi
# The hard stop: a trial still running at the budget's end is interrupted (SIGINT: its parameters
# are queued again and the reports written; killed 20 s later if that hangs, the next window
# queues it); paropt itself starts no trial in the last --reserve minutes.
timeout --signal=INT --kill-after=20 "$(awk "BEGIN{print int($MINUTES*60)}")" \
  $PY -m benchmarks.gpu.gpu_paropt "$DATASET" --loss "$LOSS" --minutes "$MINUTES" "$@" 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"

#!/usr/bin/env bash
# Hyperparameter optimisation with Optuna on the synthetic data set, the way it runs on real data:
# a persistent study (resume by rerunning), two worker processes sharing it, pruning, and a final
# training on train_tr+train_valid evaluated on the test set with the best parameters.
#
#   bash examples/paropt_synthetic.sh [WORKDIR]
#
# Environment: GRU4REC (the command, default 'gru4rec'), PYTHON (for paropt.py, default 'python'),
# N_SESSIONS (synthetic sessions, default 5000), N_TRIALS (default 8), WORKERS (default 2).
# Real data: replace the data files, drop the small-model overrides from FIXED, and use e.g.
# -nt 200. Several machines join one study with the same --storage URL (e.g.
# postgresql://user:password@host/db) and --study-name; each runs this same paropt command.
set -euo pipefail

GRU4REC=${GRU4REC:-gru4rec}
PYTHON=${PYTHON:-python}
WORK=${1:-$(mktemp -d -t gru4rec-paropt-XXXXXX)}
N_SESSIONS=${N_SESSIONS:-5000}
N_TRIALS=${N_TRIALS:-8}
WORKERS=${WORKERS:-2}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
mkdir -p "$WORK"
echo "working in $WORK"

# 1. Data: train_full / test / train_tr / train_valid TSVs (SessionId, ItemId, Time).
$GRU4REC synth "$WORK/data" --n-sessions "$N_SESSIONS" --force

# 2. The search. The cross-entropy space of the original (layers, batch size, learning rate,
#    dropouts, momentum, sample_alpha); the fixed parameters are those of the published
#    cross-entropy runs (constrained embedding, logQ 1.0) except for fewer samples and epochs,
#    so that a trial takes seconds here (the original used n_sample=2048,n_epochs=10).
#    The study lives in $WORK/out/paropt.db: interrupt this command and rerun it, and it
#    continues (--total: until the study holds N_TRIALS finished trials).
FIXED="loss=cross-entropy,constrained_embedding=True,logq=1.0,n_sample=256,n_epochs=3"
$PYTHON "$ROOT/paropt.py" "$WORK/data/train_tr.tsv" "$WORK/data/train_valid.tsv" \
    -opf "$ROOT/paramspaces/gru4rec_xe_shared_parspace.json" -fp "$FIXED" \
    -nt "$N_TRIALS" --total -m 20 -pm mrr -e conservative -fm 1 5 10 20 \
    --workers "$WORKERS" --prune-startup 2 --study-name synthetic_xe --out "$WORK/out" \
    --final-test "$WORK/data/test.tsv"

# 3. What it left: the best parameters as parameter files (JSON and the original's .py), every
#    trial as CSV/JSON, and a summary with the final test.
ls "$WORK/out"
cat "$WORK/out/synthetic_xe.best.py"

# 4. The best parameter file drives a normal training run.
$GRU4REC train "$WORK/data/train_full.tsv" -pf "$WORK/out/synthetic_xe.best.json" \
    -t "$WORK/data/test.tsv" -m 20 -e conservative

#!/usr/bin/env bash
# The gru4rec command line, step by step, on the synthetic data set (what 'gru4rec demo' does in
# one command, plus recommendations, model inspection, the baselines and the original's run.py).
#
#   bash examples/cli.sh [WORKDIR]
#
# Environment: GRU4REC (the command, default 'gru4rec'), PYTHON (for run.py, default 'python'),
# N_SESSIONS (synthetic sessions, default 25000), PARAMS (hyperparameters, see below).
set -euo pipefail

GRU4REC=${GRU4REC:-gru4rec}
PYTHON=${PYTHON:-python}
WORK=${1:-$(mktemp -d -t gru4rec-cli-XXXXXX)}
N_SESSIONS=${N_SESSIONS:-25000}
PARAMS=${PARAMS:-loss=cross-entropy,layers=64,batch_size=32,n_sample=256,n_epochs=5,learning_rate=0.1,momentum=0.1,dropout_p_hidden=0.1,logq=1.0}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$WORK"
echo "working in $WORK"

# 1. Data: train_full / test / train_tr / train_valid TSVs (SessionId, ItemId, Time).
$GRU4REC synth "$WORK/data" --n-sessions "$N_SESSIONS" --force

# 2. Train, save the model and evaluate it in one go. Results on stdout, progress on stderr.
#    Published best settings: -pf paramfiles/rsc15_xe_shared_100_best.py (add -ps to override).
$GRU4REC train "$WORK/data/train_full.tsv" -ps "$PARAMS" --save "$WORK/model.safetensors" --force \
    -t "$WORK/data/test.tsv" -m 1 5 20 -e conservative

# 3. What is in the model file (format version, items, every hyperparameter).
$GRU4REC info "$WORK/model.safetensors"

# 4. Evaluate the saved model again (same numbers) and keep the metrics as JSON.
$GRU4REC evaluate "$WORK/model.safetensors" -t "$WORK/data/test.tsv" -m 1 5 20 \
    -e conservative --metrics-json "$WORK/metrics.json" --force

# 5. Top-10 recommendations for every test session (TSV here; .parquet works with pyarrow).
$GRU4REC recommend "$WORK/model.safetensors" --input "$WORK/data/test.tsv" --k 10 \
    --exclude-seen --output "$WORK/recs.tsv" --force
head -n 4 "$WORK/recs.tsv"

# 6. Baselines evaluated exactly like the model (same lines, cutoffs and tie mode): one table.
$GRU4REC baseline pop "$WORK/data/train_full.tsv" -t "$WORK/data/test.tsv" -m 1 5 20 -e conservative
$GRU4REC baseline itemknn "$WORK/data/train_full.tsv" -t "$WORK/data/test.tsv" -m 1 5 20 -e conservative

# 7. The original's command line: load the model (-l) and evaluate it, printing the primary metric.
$PYTHON "$HERE/../run.py" "$WORK/model.safetensors" -l -t "$WORK/data/test.tsv" -m 20 -e conservative -lpm

#!/usr/bin/env bash
# One public data set's raw download -> the four split files of the published experiments.
#
#   bash examples/preprocess.sh DATASET RAW_DIR [OUT_DIR]
#
# DATASET: rsc15, yoochoose, rees46, coveo, retailrocket or diginetica; RAW_DIR holds its raw
# file(s) (which, and where to download them: docs/datasets.md). Writes
# OUT_DIR/{train_full,test,train_tr,train_valid}.tsv and stats.tsv (default OUT_DIR: data/DATASET).
# Set TRAIN=1 to also train with the data set's published best parameters (paramfiles/) on
# train_full and evaluate on test (long on a CPU).
# Environment: GRU4REC (the command, default 'gru4rec'), EXTRA (more preprocess flags, e.g. --force).
set -euo pipefail

GRU4REC=${GRU4REC:-gru4rec}
USAGE="usage: bash examples/preprocess.sh DATASET RAW_DIR [OUT_DIR]"
DATASET=${1:?$USAGE}
RAW=${2:?$USAGE}
OUT=${3:-data/$DATASET}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PARAMS=$(ls "$HERE"/../paramfiles/"$DATASET"_*_best.py 2>/dev/null | head -1 || true)

# A folder argument resolves to the expected raw file names (an unknown DATASET is an error
# there); the progress lines, then the stats table (events, sessions, items, time span per
# file) go to stdout.
$GRU4REC preprocess "$DATASET" "$RAW" --out "$OUT" ${EXTRA:-}

if [[ -z "$PARAMS" ]]; then
    echo "no published parameters for $DATASET in paramfiles/" >&2
elif [[ "${TRAIN:-0}" == 1 ]]; then
    $GRU4REC train "$OUT/train_full.tsv" -pf "$PARAMS" -t "$OUT/test.tsv" -m 1 5 10 20 -e conservative
else
    echo "next: $GRU4REC train $OUT/train_full.tsv -pf paramfiles/$(basename "$PARAMS") -t $OUT/test.tsv -m 20 -e conservative" >&2
fi

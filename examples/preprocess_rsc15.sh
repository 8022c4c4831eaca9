#!/usr/bin/env bash
# RSC15: YOOCHOOSE clicks under the GRU4Rec papers' protocol (spec §11) -> the four split files.
#
#   bash examples/preprocess_rsc15.sh RAW_DIR [OUT_DIR]
#
# RAW_DIR holds yoochoose-clicks.dat (download: docs/datasets.md). Writes OUT_DIR/{train_full,test,train_tr,
# train_valid}.tsv and stats.tsv (default OUT_DIR: data/rsc15). Set TRAIN=1 to also train with the
# published best parameters on train_full and evaluate on test (long on a CPU).
# Environment: GRU4REC (the command, default 'gru4rec'), EXTRA (more preprocess flags, e.g. --force).
set -euo pipefail

GRU4REC=${GRU4REC:-gru4rec}
RAW=${1:?usage: bash examples/preprocess_rsc15.sh RAW_DIR [OUT_DIR]}
OUT=${2:-data/rsc15}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# A folder argument resolves to the expected raw file names; progress goes to stderr, the
# stats table (events, sessions, items, time span per file) to stdout.
$GRU4REC preprocess rsc15 "$RAW" --out "$OUT" ${EXTRA:-}

if [[ "${TRAIN:-0}" == 1 ]]; then
    $GRU4REC train "$OUT/train_full.tsv" -pf "$HERE/../paramfiles/rsc15_xe_shared_100_best.py" \
        -t "$OUT/test.tsv" -m 1 5 10 20 -e conservative
else
    echo "next: $GRU4REC train $OUT/train_full.tsv -pf paramfiles/rsc15_xe_shared_100_best.py -t $OUT/test.tsv -m 20 -e conservative" >&2
fi

#!/bin/bash
# Training on one GPU under a chip's accumulation model (issue 23): the 30m preset, eager, each
# recipe with its default GEMM and with every MX GEMM summed as `--accumulation MODEL` says
# (native.mx_matmul(method="emulate")), same seed and data; then the loss comparison.
#   bash benchmarks/train_accumulation.sh OUT [RECIPES] [MODEL] [STEPS]
OUT=${1:-/tmp/accum}; RECIPES=${2:-"mxfp8 mxfp4_all_h16"}; MODEL=${3:-hopper_bf16}; STEPS=${4:-120}
DATA=/tmp/ocpmx_data/c4-mini
mkdir -p $OUT
[ -f $DATA/tokenizer.json ] || python3 -m ocpmx.cli data build-corpus --out $DATA
[ -f $DATA/c4-train.tokens.npy ] || python3 -m ocpmx.cli data tokenize --out $DATA
for recipe in $RECIPES; do
  for acc in none $MODEL; do
    d=$OUT/$recipe-$acc
    rm -rf $d
    extra=""; [ $acc != none ] && extra="--accumulation $acc"
    echo "$(date +%T) $recipe $acc"
    python3 -m ocpmx.cli train --preset 30m --recipe $recipe --data $DATA --out $d \
      --seq-len 512 --batch-size 8 --max-steps $STEPS --warmup-steps 10 --eval-every 60 \
      --eval-sequences 16 --save-every 0 --no-progress --no-tensorboard $extra > $d.log 2>&1 \
      || echo "FAILED $d (see $d.log)"
  done
done
python3 benchmarks/train_accumulation_report.py $OUT

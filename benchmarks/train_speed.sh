#!/bin/bash
# Training speed on one GPU (issue 18): tokens/s per configuration, eager, compiled and graphs
# (compiled with --compile-mode reduce-overhead: CUDA graphs), the
# stdlib corpus, sequence 1024, 32 sequences a step, 40 steps (median over steps 10-39), the
# step profiled at 30 (GPU busy time per step against the step's wall time).
#   [GEMM_METHOD=fp8_cublas] bash benchmarks/train_speed.sh OUT [PRESETS] [RECIPES] [MODES]
# GEMM_METHOD: MXLinear's GEMM method (ocpmx train --gemm-method); the run directories then
# carry it in their names (P-R-MODE-METHOD). OCPMX_LINEAR_BOTH_AXES=1/0: Tuning.linear_both_axes
# on/off over the GPU's default (native/tuning.py); the names then end in -both1 / -both0.
# OCPMX_COLUMNS_QDQ=transpose/kernel/both_axes: Tuning.columns_qdq likewise (-cols_<value>).
# LAYERS=N: N transformer blocks of each preset's shapes (ocpmx train --layers; names -L<N>),
# e.g. LAYERS=4 SEQ=8192 BATCH=1 for Llama-8B's layers on one GPU. SEQ, BATCH: as named.
OUT=${1:-/tmp/speed}; PRESETS=${2:-"30m 125m"}; RECIPES=${3:-"bf16 mxfp4_all mxfp4_all_h16"}; MODES=${4:-"eager compiled"}
DATA=/tmp/ocpmx_data/c4-mini
mkdir -p $OUT
[ -f $DATA/tokenizer.json ] || python3 -m ocpmx.cli data build-corpus --out $DATA
# tokens read from the cache (c4-*.tokens.npy), not tokenized on the host during the steps
[ -f $DATA/c4-train.tokens.npy ] || python3 -m ocpmx.cli data tokenize --out $DATA
for preset in $PRESETS; do
  for recipe in $RECIPES; do
    for mode in $MODES; do
      d=$OUT/$preset-$recipe-$mode${GEMM_METHOD:+-$GEMM_METHOD}${OCPMX_COLUMNS_QDQ:+-cols_$OCPMX_COLUMNS_QDQ}${OCPMX_LINEAR_BOTH_AXES:+-both$OCPMX_LINEAR_BOTH_AXES}${LAYERS:+-L$LAYERS}
      [ -f $d/metrics.jsonl ] && [ "$(grep -c '"loss"' $d/metrics.jsonl)" -ge 40 ] && continue
      rm -rf $d
      extra=""; [ $mode = compiled ] && extra="--compile"
      [ $mode = graphs ] && extra="--compile --compile-mode reduce-overhead"
      [ -n "$GEMM_METHOD" ] && [ $recipe != bf16 ] && extra="$extra --gemm-method $GEMM_METHOD"
      echo "$(date +%T) $preset $recipe $mode"
      python3 -m ocpmx.cli train --preset $preset --recipe $recipe --data $DATA --out $d \
        --seq-len ${SEQ:-1024} --batch-size ${BATCH:-32} --max-steps 40 --warmup-steps 5 --eval-every 1000 \
        --eval-sequences 8 --save-every 0 --profile-step 30 --no-progress --no-tensorboard \
        ${LAYERS:+--layers $LAYERS} $extra > $d.log 2>&1 || echo "FAILED $d (see $d.log)"
    done
  done
done
python3 benchmarks/train_speed_report.py $OUT

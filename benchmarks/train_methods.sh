#!/bin/bash
# One recipe trained under several MX GEMM methods against method bf16 (issue 17's check that a
# fold method's losses match bf16's within the seed noise): the 30m preset, eager, same data,
# each seed under every method; then the comparison (benchmarks/train_methods_report.py).
#   [SEQ=512] [DETERMINISTIC=1] bash benchmarks/train_methods.sh OUT [RECIPE] ["METHODS"] [STEPS] \
#       ["SEEDS"] [PRESET]
# DETERMINISTIC=1 trains with --deterministic (two runs of one seed bit-identical: a seed's delta
# is then the method's alone; results/determinism_h200/). A run whose folder already holds its
# final evaluation under the same preset, sequence length and DETERMINISTIC is kept, not run
# again (a second call after a cut hold resumes).
OUT=${1:-/tmp/methods}; RECIPE=${2:-mxfp4_all_h16}; METHODS=${3:-"fp8_cublas_rowwise fp8_cublas"}
STEPS=${4:-300}; SEEDS=${5:-"0 1 2"}; PRESET=${6:-30m}; SEQ=${SEQ:-512}
DATA=${DATA:-/tmp/ocpmx_data/c4-mini}
mkdir -p $OUT
[ -f $DATA/tokenizer.json ] || python3 -m ocpmx.cli data build-corpus --out $DATA
[ -f $DATA/c4-train.tokens.npy ] || python3 -m ocpmx.cli data tokenize --out $DATA
for seed in $SEEDS; do
  for method in bf16 $METHODS; do
    d=$OUT/$RECIPE-$method-seed$seed
    if grep -q "\"step\": $((STEPS - 1)), .*\"val_loss\"" $d/metrics.jsonl 2>/dev/null && \
        python3 -c "import json, sys; c = json.load(open('$d/config.json')); sys.exit(
          (c['preset'], c['seq_len'], c['deterministic']) != ('$PRESET', $SEQ, bool('${DETERMINISTIC:-}')))"
    then
      echo "$(date +%T) $RECIPE $method seed $seed: complete, kept"; continue
    fi
    rm -rf $d
    echo "$(date +%T) $RECIPE $method seed $seed"
    python3 -m ocpmx.cli train --preset $PRESET --recipe $RECIPE --gemm-method $method \
      --seed $seed --data $DATA --out $d --seq-len $SEQ --batch-size 8 --max-steps $STEPS \
      --warmup-steps 10 --eval-every $STEPS --eval-sequences 16 --save-every 0 --no-progress \
      --no-tensorboard ${DETERMINISTIC:+--deterministic} > $d.log 2>&1 \
      || echo "FAILED $d (see $d.log)"
  done
done
python3 benchmarks/train_methods_report.py $OUT

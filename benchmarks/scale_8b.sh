#!/bin/bash
# Llama 3.1-8B (exact config), sequence 8192, FSDP2 over all GPUs of one host: 43 steps per recipe
# (the first 10 are warm-up for timing, steps 30-31 are profiled: 31 timed steps); mxfp4_all_h16
# is also the save + resume check: 20 steps, a sharded checkpoint at step 19, then resumed to
# step 43 (30 timed steps: the first step after the resume is not timed either).
set -euo pipefail
DATA=${DATA:-data/debl}
RUNS=${RUNS:-runs/scale}
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}
RECIPES=${RECIPES:-"bf16 fp8 mxfp4_all"}
export NCCL_NVLS_ENABLE=0
[ -f "$DATA/c4-train.tokens.npy" ] || python -m ocpmx.cli data tokenize --out "$DATA"
A="--preset 8b --seq-len 8192 --batch-size 1 --grad-accum 1 --activation-checkpointing
   --lr 3e-4 --warmup-steps 10 --decay-steps 43 --eval-every 1000 --eval-sequences 8
   --profile-step 30 --checkpoint-format sharded --data $DATA --no-progress"
# one failed recipe (say, out of memory) must not stop the others; the exit status says so
rc=0
run() {
  echo "$(date -u +%T) start: $*"
  python -m torch.distributed.run --standalone --nproc-per-node "$NGPU" -m ocpmx.cli train $A "$@" \
    || { rc=$?; echo "FAILED ($rc): $*"; }
  echo "$(date -u +%T) end"
}
for R in $RECIPES; do
  run --recipe "$R" --max-steps 43 --save-every 0 --out "$RUNS/$R"
done
if [ "${SAVE_RESUME:-1}" = 1 ]; then
  run --recipe mxfp4_all_h16 --max-steps 20 --save-every 20 --out "$RUNS/mxfp4_all_h16"
  du -sh "$RUNS/mxfp4_all_h16/checkpoints" || true
  run --recipe mxfp4_all_h16 --max-steps 43 --save-every 0 --resume --out "$RUNS/mxfp4_all_h16"
fi
python -m ocpmx.cli scale-report --runs "$RUNS" || rc=$?
exit $rc

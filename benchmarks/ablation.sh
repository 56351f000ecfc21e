#!/bin/bash
# The small-scale ablation of results/ablation on the GPUs of one host: every arm x seed as a
# resumable `ocpmx train` run (run the script again to continue a cut-off ablation), then the
# table, the plots and the Wgrad error analysis. DATA: a corpus built with
#   ocpmx data build-corpus --source debian --packages large --out data/debl --vocab-size 32768
set -euo pipefail
DATA=${DATA:-data/debl}
ABL=${ABL:-runs/ablation}
[ -f "$DATA/c4-train.tokens.npy" ] || python -m ocpmx.cli data tokenize --out "$DATA"
# a failed or cut-off run must not stop the table and the analysis of the others
rc=0
python -m ocpmx.cli ablate run --out "$ABL" --data "$DATA" --per-gpu "${PER_GPU:-2}" \
  ${ARMS:+--arms $ARMS} ${SEEDS:+--seeds $SEEDS} || rc=$?
python -m ocpmx.cli ablate summarize --out "$ABL"
[ -n "${SKIP_ANALYZE:-}" ] || python -m ocpmx.cli ablate analyze --out "$ABL" --data "$DATA"
exit $rc

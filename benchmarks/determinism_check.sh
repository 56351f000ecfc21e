#!/bin/bash
# Does `ocpmx train --deterministic` make two GPU trainings of one seed bit-identical, and what
# does it cost? (results/ablation_v2/README.md, "Two trainings of one seed": without it, two
# bf16 trainings differ from step 0's backward on.) Four short trainings at once on one GPU,
# as the ablation's runs share it: two with --deterministic, two without, the ablation's 30m
# options (compiled) for STEPS steps on a small corpus (DATA: a folder `ocpmx data tokenize`
# has prepared; the tokenizer sets the vocabulary). Then every step's loss and gradient norm
# and every evaluation compared bit for bit between the pairs, and the median step speed
# (indicative only: the four share the GPU and start at different times).
#   OCPMX_COMMIT=<sha> DATA=data/mini STEPS=40 RECIPE=bf16 bash benchmarks/determinism_check.sh
# (writes $OUT/det/: summary.txt, device.txt, each run's metrics.jsonl)
# (PRESET=tiny SEQ=256: a CPU check of this script)
set -u
DATA=$(realpath ${DATA:-data/mini})
OUTDIR=${OUT:-/tmp}/det
RUNS=${RUNS_DIR:-/tmp/det_runs}  # the trainings (replaced)
PKG=${PKG_ROOT:-/tmp/p}          # PKG/ocpmx: a link to this tree, imported from there
mkdir -p $OUTDIR $PKG && rm -rf $RUNS && mkdir -p $RUNS
ln -sfn "$(cd "$(dirname "$0")/.." && pwd)" $PKG/ocpmx
export PYTHONPATH=$PKG
opts="--preset ${PRESET:-30m} --seq-len ${SEQ:-1024} --batch-size 32 --grad-accum 2 --lr 1e-3 --warmup-steps 10
      --max-steps ${STEPS:-40} --eval-every 20 --eval-sequences 64 --eval-sampling spread
      --data-order sequences --compile --no-progress --no-tensorboard --seed 2
      --recipe ${RECIPE:-bf16} --data $DATA"
for name in det_a det_b plain_a plain_b; do
  extra=""; [[ $name == det_* ]] && extra="--deterministic"
  python3 -m ocpmx.cli train $opts $extra --out $RUNS/$name > $RUNS/$name.log 2>&1 &
done
wait
{ nvidia-smi --query-gpu=name --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  # the device's copy of the tree may carry stale git metadata: the caller names the commit
  echo "commit ${OCPMX_COMMIT:-unknown (set OCPMX_COMMIT)}"; } > $OUTDIR/device.txt
python3 - $RUNS $OUTDIR <<'EOF'
import sys
from pathlib import Path
from ocpmx.llama_train.metrics import read_metrics
runs, out = Path(sys.argv[1]), Path(sys.argv[2])
lines, res = [], {}
for name in ("det_a", "det_b", "plain_a", "plain_b"):
    if not (runs / name / "metrics.jsonl").is_file():
        lines.append(f"{name}: no metrics; its log ends:\n" + "".join(
            (runs / f"{name}.log").read_text().splitlines(keepends=True)[-15:]))
        continue
    res[name] = tr, ev = read_metrics(runs / name / "metrics.jsonl")
    tps = sorted(x["tokens_per_s"] for x in tr[1:])
    lines.append(f"{name}: {len(tr)} steps, median {tps[len(tps) // 2]:,.0f} tokens/s, "
                 f"final val_loss {ev[-1]['val_loss']!r}")
for a, b in (("det_a", "det_b"), ("plain_a", "plain_b"), ("det_a", "plain_a")):
    if a not in res or b not in res:
        continue
    (ta, ea), (tb, eb) = res[a], res[b]
    first = next((x["step"] for x, y in zip(ta, tb)
                  if (x["loss"], x["grad_norm"]) != (y["loss"], y["grad_norm"])), None)
    evals = sum(x["val_loss"] == y["val_loss"] for x, y in zip(ea, eb))
    lines.append(f"{a} vs {b}: first step whose loss or grad_norm differs: {first}; "
                 f"evaluations equal: {evals} of {min(len(ea), len(eb))}; step 0 grad_norm "
                 f"{ta[0]['grad_norm']!r} / {tb[0]['grad_norm']!r}; final val_loss "
                 f"{ea[-1]['val_loss']!r} / {eb[-1]['val_loss']!r}")
(out / "summary.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
for name in res:
    (out / f"{name}.metrics.jsonl").write_text((runs / name / "metrics.jsonl").read_text())
EOF

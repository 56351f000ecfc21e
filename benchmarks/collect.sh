#!/bin/bash
# Progress of the runs under $1 (one line per run: last step, loss, median tokens/s, status) and
# a tarball of their small files (metrics, status, logs, configs, tables, plots) as $2.
ROOT=$1; TAR=$2
for m in $(find "$ROOT" -name metrics.jsonl | sort); do
  d=$(dirname "$m")
  python - "$m" "$d" <<'PY'
import json, sys, pathlib
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
tr = [r for r in rows if "loss" in r]; va = [r for r in rows if "val_loss" in r]
st = pathlib.Path(sys.argv[2], "status.json")
tps = sorted(r["tokens_per_s"] for r in tr)
print(f"{sys.argv[2]:45} step {tr[-1]['step'] if tr else '-':>5} loss {tr[-1]['loss'] if tr else float('nan'):.4f} "
      f"val {va[-1]['val_loss'] if va else float('nan'):.4f} tok/s {tps[len(tps)//2] if tps else 0:,.0f} "
      f"{json.loads(st.read_text())['status'] if st.exists() else 'running'}")
PY
done
[ -n "$TAR" ] && (cd "$ROOT" && find . \( -name "*.jsonl" -o -name "*.json" -o -name "log.txt" -o -name "*.md" \
  -o -name "*.png" -o -name "commands.txt" \) -not -path "*/checkpoints/*" -print0 | tar czf "$TAR" --null -T -)
true

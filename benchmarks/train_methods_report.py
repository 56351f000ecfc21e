"""Loss comparison of one recipe trained under several MX GEMM methods (``train_methods.sh``):
for each seed, every method's run against the same seed's method-bf16 run (max |delta train
loss|, final train and validation loss, the fold's rounded elements), and the seed noise: the
spread of the bf16 method's final losses over the seeds, against which a method's deltas are
read.

  python benchmarks/train_methods_report.py OUT   # writes OUT/README.md and prints it
"""
from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

from train_accumulation_report import load  # (train rows by step, val_loss by step)


def main(out: Path):
    runs = {}
    for d in sorted(out.iterdir()):
        m = re.fullmatch(r"(.+)-(\w+)-seed(\d+)", d.name)
        if m and (d / "metrics.jsonl").exists():
            runs[(m[1], m[2], int(m[3]))] = load(d)
    lines = ["| recipe | method | seed | steps | final train loss, bf16 | method | max \\|Δ train "
             "loss\\| | final val_loss, bf16 | method | fold elements rounded |",
             "|" + "---|" * 10]
    finals = {}
    for (recipe, method, seed), (t1, v1) in sorted(runs.items()):
        finals.setdefault((recipe, method), []).append(t1[max(t1)]["loss"])
        base = runs.get((recipe, "bf16", seed))
        if method == "bf16" or base is None:
            continue
        t0, v0 = base
        inexact = t1[max(t1)].get("fold_inexact")  # the running count, at the last step
        steps = sorted(set(t0) & set(t1))
        if not steps:
            continue
        diffs = [abs(t0[s]["loss"] - t1[s]["loss"]) for s in steps]
        last, vs = steps[-1], sorted(set(v0) & set(v1))
        lines.append(f"| {recipe} | {method} | {seed} | {len(steps)} | {t0[last]['loss']:.5f} | "
                     f"{t1[last]['loss']:.5f} | {max(diffs):.5f} | "
                     + (f"{v0[vs[-1]]:.5f} | {v1[vs[-1]]:.5f} | " if vs else "- | - | ")
                     + f"{inexact if inexact is not None else '-'} |")
    lines += ["", "| recipe | method | seeds | final train loss: mean | spread (max - min) |",
              "|---|---|---|---|---|"]
    for (recipe, method), v in sorted(finals.items()):
        lines.append(f"| {recipe} | {method} | {len(v)} | {statistics.mean(v):.5f} | "
                     f"{max(v) - min(v):.5f} |")
    text = "\n".join(lines) + "\n"
    (out / "README.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""Loss comparison of training runs under an accumulation model against the default GEMM
(issue 23): for each `<recipe>-none` folder in OUT, every `<recipe>-<model>` beside it.

  python benchmarks/train_accumulation_report.py OUT   # writes OUT/README.md and prints it
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def load(d: Path):
    train, val = {}, {}
    for line in (d / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if "loss" in r:
            train[r["step"]] = r
        elif "val_loss" in r:
            val[r["step"]] = r["val_loss"]
    return train, val


def main(out: Path):
    lines = ["| recipe | model | steps | final train loss, default | under model | final val_loss, "
             "default | under model | max \\|Δ train loss\\| | first step that differs | "
             "tokens/s, default | under model |", "|" + "---|" * 11]
    for base in sorted(out.glob("*-none")):
        recipe = base.name[:-len("-none")]
        if not (base / "metrics.jsonl").exists():
            continue
        t0, v0 = load(base)
        for other in sorted(out.glob(f"{recipe}-*")):
            if other == base or not (other / "metrics.jsonl").exists():
                continue
            t1, v1 = load(other)
            steps = sorted(set(t0) & set(t1))
            if not steps:
                continue
            diffs = [abs(t0[s]["loss"] - t1[s]["loss"]) for s in steps]
            first = next((s for s in steps if t0[s]["loss"] != t1[s]["loss"]), None)
            last = steps[-1]
            vs = sorted(set(v0) & set(v1))
            tps = [statistics.median(t[s]["tokens_per_s"] for s in steps[len(steps) // 4:])
                   for t in (t0, t1)]
            lines.append(
                f"| {recipe} | {other.name[len(recipe) + 1:]} | {len(steps)} | "
                f"{t0[last]['loss']:.5f} | {t1[last]['loss']:.5f} | "
                + (f"{v0[vs[-1]]:.5f} | {v1[vs[-1]]:.5f} | " if vs else "- | - | ")
                + f"{max(diffs):.5f} | {first if first is not None else 'none (bit-identical)'} | "
                f"{tps[0]:.0f} | {tps[1]:.0f} |")
    text = "\n".join(lines) + "\n"
    (out / "README.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

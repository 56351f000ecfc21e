"""Loss comparison of one recipe trained under several MX GEMM methods (``train_methods.sh``):
for each seed, every method's run against the same seed's method-bf16 run (max |delta train
loss|, final train and validation loss, the fold's rounded elements and their share of all
folded elements), then per method the mean and range of the paired validation deltas against
the seed noise: the spread of method bf16's final validation loss over the seeds.

A folder named ``RECIPE-bf16_rerun-seedN`` (a second method-bf16 run of seed N, without
``--deterministic``) enters as one more "method": its delta is the run-to-run noise of one seed.

  python benchmarks/train_methods_report.py OUT   # writes OUT/README.md and prints it
"""
from __future__ import annotations

import fnmatch
import json
import re
import statistics
import sys
from pathlib import Path

import torch

from train_accumulation_report import load  # (train rows by step, val_loss by step)


def folded_per_step(config: dict) -> int | None:
    """Elements a step folds: both operands of every MX GEMM of every converted linear (the
    layers ``keep_bf16`` leaves alone excluded), counted on the model built on the meta
    device. None for a recipe without MX GEMMs, and where a step folds more than that or
    evaluations fold between the logged steps (gradient accumulation folds each weight once
    a micro-batch, activation checkpointing runs Fprop twice, an evaluation before the last
    step adds its forward's folds to the running count): not counted here."""
    from ocpmx.llama_train.model import Llama, ModelConfig
    from ocpmx.native.recipes import GEMMS, OPERANDS, get_recipe
    recipe = get_recipe(config["recipe"])
    mx = [g for g in GEMMS if recipe.gemm(g).is_mx]
    if not mx or config["grad_accum"] != 1 or config["activation_checkpointing"] or \
            config["eval_every"] < config["max_steps"]:
        return None
    with torch.device("meta"):
        model = Llama(ModelConfig(**{k: tuple(v) if isinstance(v, list) else v
                                     for k, v in config["model"].items()}))
    tokens = config["seq_len"] * config["batch_size"] * config["grad_accum"]
    total = 0
    for name, mod in model.named_modules():
        if not isinstance(mod, torch.nn.Linear) or any(
                fnmatch.fnmatchcase(name, p) for p in config["keep_bf16"]):
            continue
        n, k = mod.weight.shape
        size = {"x": tokens * k, "w": n * k, "dy": tokens * n}
        total += sum(size[o] for g in mx for o in OPERANDS[g])
    return total


def main(out: Path):
    runs, configs = {}, {}
    for d in sorted(out.iterdir()):
        m = re.fullmatch(r"(.+)-(\w+)-seed(\d+)", d.name)
        if m and (d / "metrics.jsonl").exists():
            key = (m[1], m[2], int(m[3]))
            runs[key] = load(d)
            configs[key] = json.loads((d / "config.json").read_text())
    lines = ["| recipe | method | seed | steps | final train loss, bf16 | method | max \\|Δ train "
             "loss\\| | final val_loss, bf16 | method | Δ val_loss | fold elements rounded | "
             "of all folded |", "|" + "---|" * 12]
    deltas, bf16_val = {}, {}
    for (recipe, method, seed), (t1, v1) in sorted(runs.items()):
        cfg = configs[(recipe, method, seed)]
        complete = t1 and max(t1) + 1 >= cfg["max_steps"] and v1
        if method == "bf16" and complete:
            bf16_val.setdefault(recipe, []).append(v1[max(v1)])
        base = runs.get((recipe, "bf16", seed))
        if method == "bf16" or base is None:
            continue
        t0, v0 = base
        base_cfg = configs[(recipe, "bf16", seed)]
        complete = complete and max(t0) + 1 >= base_cfg["max_steps"] and v0
        steps = sorted(set(t0) & set(t1))
        if not steps:
            continue
        inexact = t1[max(t1)].get("fold_inexact")  # the running count, at the last step
        share = "-"
        per_step = folded_per_step(cfg) if inexact is not None else None
        if per_step:
            share = f"{inexact / (per_step * (max(t1) + 1)):.2e}"
        diffs = [abs(t0[s]["loss"] - t1[s]["loss"]) for s in steps]
        last, vs = steps[-1], sorted(set(v0) & set(v1))
        dv = "-"
        if vs:
            dv = f"{v1[vs[-1]] - v0[vs[-1]]:+.5f}"
            if complete:
                deltas.setdefault((recipe, method), []).append(v1[vs[-1]] - v0[vs[-1]])
        lines.append(f"| {recipe} | {method} | {seed} | {len(steps)} | {t0[last]['loss']:.5f} | "
                     f"{t1[last]['loss']:.5f} | {max(diffs):.5f} | "
                     + (f"{v0[vs[-1]]:.5f} | {v1[vs[-1]]:.5f} | " if vs else "- | - | ")
                     + f"{dv} | {inexact if inexact is not None else '-'} | {share} |")
    lines += ["", "Complete runs only (every step and the final evaluation). Seed noise: method "
              "bf16's final val_loss over the seeds.", "",
              "| recipe | method | seeds | Δ val_loss vs bf16, same seed: mean | min | max | "
              "bf16 val_loss: mean | spread (max - min) over seeds | max \\|Δ\\| / spread |",
              "|" + "---|" * 9]
    for (recipe, method), d in sorted(deltas.items()):
        b = bf16_val.get(recipe, [])
        spread = max(b) - min(b) if len(b) > 1 else None
        ratio = f"{max(map(abs, d)) / spread:.2f}" if spread else "-"
        lines.append(f"| {recipe} | {method} | {len(d)} | {statistics.mean(d):+.5f} | "
                     f"{min(d):+.5f} | {max(d):+.5f} | "
                     + (f"{statistics.mean(b):.5f} | {spread:.5f} | " if spread else "- | - | ")
                     + f"{ratio} |")
    text = "\n".join(lines) + "\n"
    (out / "README.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

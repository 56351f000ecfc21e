"""The multi-GPU throughput table (results/scale): one row per run directory of
``benchmarks/scale_8b.sh``, from the files the training loop writes (metrics.jsonl, config.json,
memory.json, step_breakdown.json).

Timed steps: those from ``warmup`` on, without the two profiled steps (the profiler slows them)
and without the first step after a resume (it pays for loading the checkpoint and compiling
kernels again). Tokens/s and MFU are medians over the timed steps; tokens/s per GPU is the
step's tokens over all ranks divided by the world size.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from .metrics import read_metrics
from .plotting import plot


def timed_steps(train_rows: list[dict], warmup: int, profile_step: int | None) -> list[dict]:
    seen, rows = set(), []
    for i, r in enumerate(train_rows):
        s = r["step"]
        resumed = r.get("resumed", False) or (i > 0 and s != train_rows[i - 1]["step"] + 1)
        if s in seen:  # a step logged twice (re-run after a cut): keep the last
            rows = [x for x in rows if x["step"] != s]
        seen.add(s)
        if s < warmup or resumed or (profile_step is not None and s in (profile_step, profile_step + 1)):
            continue
        rows.append(r)
    return rows


def run_row(d: Path, warmup: int = 10) -> dict:
    cfg = json.loads((d / "config.json").read_text())
    train_rows, val_rows = read_metrics(d / "metrics.jsonl")
    world = int(cfg.get("world", 1))
    rows = timed_steps(train_rows, warmup, cfg.get("profile_step") or None)
    med = (lambda k: statistics.median(r[k] for r in rows)) if rows else (lambda k: float("nan"))
    mem = json.loads((d / "memory.json").read_text()) if (d / "memory.json").is_file() else None
    brk = json.loads((d / "step_breakdown.json").read_text()) \
        if (d / "step_breakdown.json").is_file() else None
    return {
        "run": d.name, "recipe": cfg.get("recipe"), "world": world,
        "seq_len": cfg.get("seq_len"), "steps": len(train_rows), "timed_steps": len(rows),
        "tokens_per_s_per_gpu": med("tokens_per_s") / world, "mfu": med("mfu"),
        "step_s": (cfg.get("batch_size", 1) * cfg.get("grad_accum", 1) * cfg.get("seq_len", 0)
                   * world / med("tokens_per_s")) if rows else float("nan"),
        # memory.json: {"allocated_gb": [per rank], "reserved_gb": [per rank]} (profiling.peak_memory)
        "peak_memory_gb": mem,
        "max_allocated_gb": max(mem["allocated_gb"]) if mem else None,
        "max_reserved_gb": max(mem["reserved_gb"]) if mem else None,
        "gpu_ms_per_step": brk["gpu_ms_per_step"] if brk else None,
        "loss_first": train_rows[0]["loss"] if train_rows else None,
        "loss_last": train_rows[-1]["loss"] if train_rows else None,
        "val_loss": val_rows[-1]["val_loss"] if val_rows else None,
        # the recipe's own forward (runs from before issue 16 logged only that, as val_loss)
        "val_loss_recipe": val_rows[-1].get("val_loss_recipe", val_rows[-1]["val_loss"])
        if val_rows else None,
        "val_loss_is_bf16_forward": bool(val_rows) and "val_loss_recipe" in val_rows[-1],
    }


def summarize(root, out=None, warmup: int = 10) -> list[dict]:
    """Rows for every run under ``root``; writes scale.json, scale.md and loss.png to ``out``
    (default: ``root``)."""
    root = Path(root)
    out = Path(out or root)
    out.mkdir(parents=True, exist_ok=True)
    dirs = sorted(p.parent for p in root.glob("*/metrics.jsonl"))
    rows = [run_row(d, warmup) for d in dirs]
    (out / "scale.json").write_text(json.dumps(rows, indent=1))
    (out / "scale.md").write_text(markdown(rows, warmup))
    if dirs:
        plot([str(d) for d in dirs], str(out / "loss.png"))
    return rows


def markdown(rows: list[dict], warmup: int = 10) -> str:
    cats = ["gemm", "quantize", "dequantize", "attention", "communication", "other"]
    lines = [f"Timed: steps from {warmup} on, without the profiled steps and the first step after "
             "a resume; medians. GPU ms per step by kernel category from the profiled steps "
             "(rank 0; communication overlaps compute, so the categories can add up to more "
             "than the step). Val loss: the last evaluation, the master weights through a bf16 "
             "forward / the recipe's own forward (runs from before issue 16: the recipe's only).",
             "",
             "| run | GPUs | tokens/s/GPU | MFU | step s | peak GiB allocated / reserved (max over GPUs) | "
             + " | ".join(f"{c} ms" for c in cats) + " | loss first → last | val loss bf16 fwd / "
             "recipe fwd |",
             "|---" * (8 + len(cats)) + "|"]
    for r in rows:
        ms = r["gpu_ms_per_step"] or {}
        mem = (f"{r['max_allocated_gb']:.1f} / {r['max_reserved_gb']:.1f}"
               if r["max_allocated_gb"] is not None else "—")
        lines.append(
            f"| {r['run']} | {r['world']} | {r['tokens_per_s_per_gpu']:,.0f} | {r['mfu']:.1%} | "
            f"{r['step_s']:.2f} | {mem} | "
            + " | ".join(f"{ms[c]:.0f}" if c in ms else "—" for c in cats)
            + f" | {r['loss_first']:.3f} → {r['loss_last']:.3f} | {_val(r)} |")
    return "\n".join(lines) + "\n"


def _val(r: dict) -> str:
    if r.get("val_loss") is None:
        return "—"
    if not r.get("val_loss_is_bf16_forward", False):
        return f"— / {r['val_loss_recipe']:.3f}"
    return f"{r['val_loss']:.3f} / {r['val_loss_recipe']:.3f}"

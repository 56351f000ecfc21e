"""The table of benchmarks/train_speed.sh's runs: median tokens/s over steps 10-39 (without the
profiled steps), the profiled step's GPU busy time against its wall time, and the self CPU
time of the host operations the profiler saw (``step_breakdown.json``'s
``host_ops_ms_per_step``, profiler overhead included). The both-axes column: whether MXLinear's both-axes pass was on
(config.json's ``linear_both_axes_run``; runs written before it: the run name's ``-both1`` /
``-both0``, else unknown). The setting column: what train_speed.sh's run name carries after
PRESET-RECIPE-MODE (a GEMM method, ``cols_<columns_qdq>``, ``both1`` / ``both0``: an
environment setting of the run; config.json's ``tuning_run`` has the tiles themselves); each
run's ratio is against bf16 of the same preset, mode and setting, else of the setting less its
leading parts one at a time (``-bf16-L4``: ``-L4``, bf16 runs take no GEMM method), else against
the plain bf16 run.

  python benchmarks/train_speed_report.py RUNS_DIR   -> RUNS_DIR/train_speed.md, .json
"""
import json
import statistics
import sys
from pathlib import Path


def both_axes_setting(setting: str | None) -> bool | None:
    """The both-axes pass a run's setting sets (its ``-both1`` / ``-both0`` part), else None."""
    parts = (setting or "").split("-")
    return True if "both1" in parts else False if "both0" in parts else None


def row(d: Path) -> dict:
    cfg = json.loads((d / "config.json").read_text())
    rows = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines() if l.strip()]
    steps = [r for r in rows if "loss" in r and 10 <= r["step"] <= 39
             and r["step"] not in (cfg.get("profile_step"), (cfg.get("profile_step") or -9) + 1)]
    tps = statistics.median(r["tokens_per_s"] for r in steps) if steps else float("nan")
    step_tokens = cfg["batch_size"] * cfg["grad_accum"] * cfg["seq_len"]
    brk = d / "step_breakdown.json"
    b = json.loads(brk.read_text()) if brk.is_file() else {}
    gpu_ms = sum(b["gpu_ms_per_step"].values()) if b else None
    host_ms = b.get("host_ops_ms_per_step")  # (breakdowns before 2026-11-26 lack it)
    mode = "compiled" if cfg.get("compile") else "eager"
    cmode = cfg.get("compile_mode", "default")
    if mode == "compiled" and cmode != "default":
        # reduce-overhead: compiled, each step replayed from CUDA graphs
        mode = "graphs" if cmode == "reduce-overhead" else f"compiled-{cmode}"
    # train_speed.sh's names: PRESET-RECIPE-MODE, then the settings of the run (a GEMM method,
    # -cols_<columns_qdq>, -both1 / -both0): each run is compared with bf16 of the same ones
    prefix = f"{cfg.get('preset')}-{cfg.get('recipe')}-{mode}"
    setting = d.name[len(prefix):] if d.name.startswith(prefix) else None
    named = both_axes_setting(setting)
    both = cfg.get("linear_both_axes_run",
                   None if cfg.get("recipe") == "bf16" else named)  # (bf16: no MX GEMM)
    return {"run": d.name, "preset": cfg.get("preset"), "recipe": cfg.get("recipe"), "mode": mode,
            "gemm_method_run": cfg.get("gemm_method_run"), "linear_both_axes_run": both,
            "setting": setting,
            "tokens_per_s": tps, "mfu": statistics.median(r["mfu"] for r in steps) if steps else None,
            "step_ms": 1e3 * step_tokens / tps if steps else None, "gpu_busy_ms": gpu_ms,
            "host_ops_ms": host_ms,
            "timed_steps": len(steps), "loss_last": rows[-1].get("loss") if rows else None}


def baseline_settings(setting: str | None) -> list:
    """The settings whose bf16 run a run of ``setting`` compares with, best first: its own, then
    less its leading parts one at a time (a GEMM method, which bf16 runs do not take; a
    setting bf16 was not run with), down to none."""
    parts = (setting or "").split("-")[1:]
    out = [setting] + ["".join("-" + p for p in parts[i:]) for i in range(1, len(parts) + 1)]
    return out if out[-1] == "" else out + [""]


def main(root):
    root = Path(root)
    rows = [row(d) for d in sorted(p for p in root.iterdir() if (p / "metrics.jsonl").is_file())]
    by = {(r["preset"], r["mode"], r["recipe"], r["setting"]): r for r in rows}
    lines = ["| preset | recipe | mode | GEMM method | both-axes pass | setting | tokens/s | MFU "
             "| step ms | GPU busy ms (profiled step) | busy / step | host ops ms (profiled step) "
             "| × bf16 same mode |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        both = {True: "on", False: "off", None: "—"}[r["linear_both_axes_run"]]
        named = {True: "on", False: "off"}.get(both_axes_setting(r["setting"]))
        if r["linear_both_axes_run"] is None and named:  # bf16 of a setting
            both += f" (set {named})"
        head = (f"| {r['preset']} | {r['recipe']} | {r['mode']} | "
                f"{r['gemm_method_run'] or '—'} | {both} | "
                f"{(r['setting'] or '').lstrip('-') or '—'} |")
        if not r["timed_steps"]:  # a run that stopped (or failed) before step 10: no time
            lines.append(f"{head} no timed step (see the run's log) |" + " — |" * 6)
            continue
        base = next((by[k] for k in ((r["preset"], r["mode"], "bf16", s)
                                     for s in baseline_settings(r["setting"])) if k in by), None)
        rel = r["tokens_per_s"] / base["tokens_per_s"] if base else float("nan")
        busy = r["gpu_busy_ms"]
        busy_ms = "—" if busy is None else f"{busy:.1f}"
        share = "—" if busy is None else f"{busy / r['step_ms']:.2f}"
        host = "—" if r["host_ops_ms"] is None else f"{r['host_ops_ms']:.1f}"
        lines.append(f"{head} {r['tokens_per_s']:,.0f} | "
                     f"{(r['mfu'] or 0):.1%} | {r['step_ms']:.1f} | {busy_ms} | {share} | "
                     f"{host} | {rel:.2f} |")
    (root / "train_speed.json").write_text(json.dumps(rows, indent=1))
    (root / "train_speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1])

"""The small-scale ablation of the study's claims: the Fprop -> Dgrad -> Wgrad ladder and the
rotation / rounding interventions on Wgrad, several seeds, side by side on the GPUs of one host.

``run_ablation`` runs a list of (arm, seed) training runs, each an ``ocpmx train`` process with
``--resume`` in ``OUT/<arm>/seed<k>`` (a cut-off run continues from its last checkpoint, a
finished one is skipped), ``per_gpu`` at a time on each GPU. Same seed = same initial weights and
same data order in every arm. ``summarize`` reads the runs back and writes the table (Markdown
and JSON) and the plots.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

ARMS = ("bf16", "fp8", "mxfp4_fprop", "mxfp4_fprop_dgrad", "mxfp4_all", "mxfp4_all_h16",
        "mxfp4_all_h16_wgrad", "mxfp4_all_sr_wgrad", "mxfp4_all_rht_wgrad",
        "mxfp4_all_rht_fixed_wgrad")
SEEDED_ARMS = ("bf16", "mxfp4_all", "mxfp4_all_h16")  # three seeds; the others one

# the settings of the committed ablation (results/ablation): 30m, 65,536 tokens per step
# (32 x 1024, two micro-batches), 1,526 steps = 100 M tokens
DEFAULT_TRAIN_ARGS = ("--preset", "30m", "--seq-len", "1024", "--batch-size", "32",
                      "--grad-accum", "2", "--lr", "1e-3", "--warmup-steps", "50",
                      "--max-steps", "1526", "--eval-every", "50", "--eval-sequences", "256",
                      "--save-every", "100", "--keep", "1", "--no-progress")

EXIT_STATUS = {0: "done", 3: "diverged"}


def plan(arms=ARMS, seeds=(0, 1, 2), seeded=SEEDED_ARMS) -> list[tuple[str, int]]:
    """(arm, seed) pairs: every arm with seed 0 first, then the extra seeds of ``seeded``, so a
    run cut short by the budget loses extra seeds before arms."""
    runs = [(a, seeds[0]) for a in arms]
    runs += [(a, s) for s in seeds[1:] for a in arms if a in seeded]
    return runs


def run_dir(out, arm: str, seed: int) -> Path:
    return Path(out) / arm / f"seed{seed}"


def run_status(d: Path) -> str | None:
    f = d / "status.json"
    return json.loads(f.read_text())["status"] if f.is_file() else None


def gpu_slots(gpus: list[str], per_gpu: int) -> list[str]:
    """One entry per concurrent run, round-robin over the GPUs, so that runs started together
    (the arms in plan order) spread over all GPUs instead of filling the first one."""
    return [g for _ in range(per_gpu) for g in gpus] or ["cpu"]


def run_ablation(out, runs, data: str, gpus: list[str], per_gpu: int = 1,
                 train_args=DEFAULT_TRAIN_ARGS, poll_s: float = 5.0) -> dict:
    """Run ``runs`` ((arm, seed) pairs) as ``ocpmx train`` processes, ``per_gpu`` at a time per
    GPU (CUDA_VISIBLE_DEVICES), each resumable; returns {run dir: status}."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = {str(run_dir(out, *r)): run_status(run_dir(out, *r)) for r in runs}
    todo = [r for r in runs if results[str(run_dir(out, *r))] not in ("done", "diverged")]
    slots = gpu_slots(gpus, per_gpu)
    threads = str(max(1, (os.cpu_count() or 1) // len(slots)))
    active: dict[str, tuple] = {}
    (out / "commands.txt").write_text("".join(
        f"{sys.executable} -m ocpmx.cli train {' '.join(train_args)} --data {data} "
        f"--recipe {a} --seed {s} --out {run_dir(out, a, s)} --resume\n" for a, s in runs))
    while todo or active:
        free = [i for i in range(len(slots)) if i not in active]
        while todo and free:
            i = free.pop(0)
            arm, seed = todo.pop(0)
            d = run_dir(out, arm, seed)
            d.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "ocpmx.cli", "train", *train_args, "--data", data,
                   "--recipe", arm, "--seed", str(seed), "--out", str(d), "--resume"]
            env = dict(os.environ)
            env.setdefault("OMP_NUM_THREADS", threads)  # share the host's cores among the runs
            env.setdefault("NUMBA_NUM_THREADS", threads)  # Numba's pool too (Philox draws)
            if slots[i] != "cpu":
                env["CUDA_VISIBLE_DEVICES"] = slots[i]
            log = open(d / "log.txt", "a")
            active[i] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env),
                         d, log, time.time())
            print(f"start {d} on {slots[i]}", flush=True)
        time.sleep(poll_s)
        for i, (proc, d, log, t0) in list(active.items()):
            rc = proc.poll()
            if rc is None:
                continue
            log.close()
            status = EXIT_STATUS.get(rc, f"failed (exit {rc})")
            (d / "status.json").write_text(json.dumps({"status": status, "exit": rc,
                                                       "seconds": time.time() - t0}))
            results[str(d)] = status
            print(f"{status}: {d} ({time.time() - t0:.0f} s)", flush=True)
            del active[i]
    return results


# ---- analysis of finished runs ---------------------------------------------------------------

def _interp_tokens(curve: list[tuple[int, float]], target: float) -> float | None:
    """The first token count at which a validation curve reaches ``target`` (linear
    interpolation between evaluations), or None if it never does."""
    prev = None
    for t, v in curve:
        if v <= target:
            if prev is None:
                return float(t)
            (t0, v0) = prev
            return t0 + (t - t0) * (v0 - target) / (v0 - v) if v0 != v else float(t)
        prev = (t, v)
    return None


def _value_at(curve: list[tuple[int, float]], tokens: float) -> float:
    for (t0, v0), (t1, v1) in zip(curve, curve[1:]):
        if t0 <= tokens <= t1:
            return v0 + (v1 - v0) * (tokens - t0) / (t1 - t0)
    raise ValueError(f"{tokens} tokens lie outside the curve")


def load_runs(out) -> dict[str, dict[int, dict]]:
    """{arm: {seed: {"val": [(tokens, loss)], "train": [(tokens, loss)], "status", ...}}}"""
    from .metrics import read_metrics
    runs: dict[str, dict[int, dict]] = {}
    for m in sorted(Path(out).glob("*/seed*/metrics.jsonl")):
        arm, seed = m.parent.parent.name, int(m.parent.name[4:])
        train, val = read_metrics(m)
        if not train:
            continue
        status = run_status(m.parent) or "incomplete"
        runs.setdefault(arm, {})[seed] = {
            "val": [(r["tokens"], r["val_loss"]) for r in val],
            "train": [(r["tokens"], r["loss"]) for r in train],
            "skipped": train[-1].get("skipped", 0), "status": status,
            "tokens": train[-1]["tokens"],
            "tokens_per_s": sorted(r["tokens_per_s"] for r in train)[len(train) // 2],
        }
    return runs


def _mean_std(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else None
    return m, sd


def summarize(out, reference: str = "bf16", fraction: float = 0.75) -> dict:
    """The table: final validation loss (mean ± std over seeds), the tokens each arm needs to
    reach the loss ``reference`` reached at ``fraction`` of the budget (per seed against the same
    seed's reference where there is one, else against the reference's mean curve), and flags.
    Writes OUT/table.md, OUT/table.json, OUT/val_loss.png."""
    runs = load_runs(out)
    if reference not in runs:
        raise ValueError(f"no finished {reference!r} run under {out}")
    budget = max(r["tokens"] for r in runs[reference].values())
    ref_target = {s: _value_at(r["val"], fraction * budget) for s, r in runs[reference].items()}
    ref_mean = sum(ref_target.values()) / len(ref_target)
    ref_tokens = fraction * budget
    rows = []
    for arm in [a for a in ARMS if a in runs] + [a for a in runs if a not in ARMS]:
        seeds = runs[arm]
        finals, extras, flags, gaps, deltas = [], [], [], [], []
        complete = {s: r for s, r in seeds.items() if r["status"] in ("done", "diverged")}
        for s, r in sorted(seeds.items()):
            if s not in complete:  # cut off: its curve so far is plotted, not tabulated
                flags.append(f"seed {s}: {r['status']} at {r['tokens'] / 1e6:.0f} M tokens")
                continue
            finals.append(r["val"][-1][1] if r["val"] else None)
            ref = runs[reference].get(s)  # the same seed's reference run (same data order)
            if ref is not None and ref["status"] == "done" and r["val"] and ref["val"]:
                deltas.append(r["val"][-1][1] - ref["val"][-1][1])
            target = ref_target.get(s, ref_mean)
            t = _interp_tokens(r["val"], target)
            extras.append(None if t is None else t / ref_tokens - 1)
            if r["status"] != "done":
                flags.append(f"seed {s}: {r['status']}")
            if r["skipped"]:
                flags.append(f"seed {s}: {r['skipped']} skipped steps")
            bad = sum(1 for _, v in r["train"] if not math.isfinite(v))
            if bad:
                flags.append(f"seed {s}: {bad} non-finite losses")
            if ref is not None and arm != reference:
                # the largest validation-loss gap to the same seed's reference after 10% of the
                # budget (same data order): a divergence shows here before it shows at the end
                rv = dict(ref["val"])
                gaps.append(max((v - rv[t] for t, v in r["val"] if t in rv and t > 0.1 * budget),
                                default=None))
        fm, fs = _mean_std(finals)
        em, es = _mean_std(extras)
        dm, ds = _mean_std(deltas)
        rows.append({"arm": arm, "seeds": sorted(complete), "incomplete": sorted(set(seeds) - set(complete)),
                     "final_val_loss": finals,
                     "delta_vs_reference": deltas, "delta_mean": dm, "delta_std": ds,
                     "final_val_loss_mean": fm, "final_val_loss_std": fs,
                     "extra_tokens": extras, "extra_tokens_mean": em, "extra_tokens_std": es,
                     "reached": [e is not None for e in extras],
                     "tokens": [complete[s]["tokens"] for s in sorted(complete)],
                     "tokens_per_s": [complete[s]["tokens_per_s"] for s in sorted(complete)],
                     "max_val_gap": max((g for g in gaps if g is not None), default=None),
                     "flags": flags})
    table = {"reference": reference, "fraction": fraction, "budget_tokens": budget,
             "reference_target_loss": ref_target, "rows": rows}
    Path(out, "table.json").write_text(json.dumps(table, indent=1))
    Path(out, "table.md").write_text(table_markdown(table))
    plot_ablation(runs, Path(out) / "val_loss.png", reference)
    return table


def _pm(m, s, fmt):
    if m is None:
        return "—"
    return format(m, fmt) + ("" if s is None else " ± " + format(s, fmt))


def table_markdown(table: dict) -> str:
    f = table["fraction"]
    lines = [f"Reference: `{table['reference']}` at {f:.0%} of {table['budget_tokens']:,} tokens. "
             "Extra tokens: how many more tokens than that the arm needs to reach the same "
             "validation loss (per seed against the same seed's reference). '> x' means not "
             "reached within the budget.", "",
             "Max gap: the largest validation-loss excess over the same seed's reference at one "
             "evaluation after 10% of the budget.", "",
             "Δ final: final validation loss minus the same seed's reference (mean ± std over "
             "seeds). Only complete runs enter the statistics.", "",
             "| arm | seeds | final val loss | Δ final | extra tokens | max gap | flags |",
             "|---|---|---|---|---|---|---|"]
    limit = 1 / f - 1
    for r in table["rows"]:
        if not r["reached"]:
            extra = "—"
        elif all(r["reached"]):
            extra = _pm(None if r["extra_tokens_mean"] is None else 100 * r["extra_tokens_mean"],
                        None if r["extra_tokens_std"] is None else 100 * r["extra_tokens_std"],
                        "+.1f") + " %"
        else:
            got = [100 * e for e in r["extra_tokens"] if e is not None]
            extra = f"> {100 * limit:+.0f} % ({len(got)} of {len(r['reached'])} seeds reached)"
        gap = "—" if r["max_val_gap"] is None else f"{r['max_val_gap']:+.3f}"
        lines.append(f"| {r['arm']} | {len(r['seeds'])} | "
                     f"{_pm(r['final_val_loss_mean'], r['final_val_loss_std'], '.4f')} | "
                     f"{_pm(r['delta_mean'], r['delta_std'], '+.4f')} | {extra} | {gap} | {'; '.join(r['flags']) or '—'} |")
    return "\n".join(lines) + "\n"


def plot_ablation(runs, png, reference: str = "bf16"):
    """Validation loss against tokens (mean over the seeds that reached each evaluation) for every
    arm, and the gap to the reference: at each evaluation the mean over seeds of the arm's loss
    minus the same seed's reference loss (same data order)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 5))

    def mean_curve(curves):
        at: dict[int, list[float]] = {}
        for c in curves:
            for t, v in c:
                at.setdefault(t, []).append(v)
        return sorted((t, sum(v) / len(v)) for t, v in at.items())

    for arm in [x for x in ARMS if x in runs] + [x for x in runs if x not in ARMS]:
        seeds = runs[arm]
        c = mean_curve([r["val"] for r in seeds.values()])
        label = f"{arm} ({len(seeds)} seeds)" if len(seeds) > 1 else arm
        style = "-" if arm in SEEDED_ARMS else "--"
        a.plot([t for t, _ in c], [v for _, v in c], style, label=label)
        gaps = []
        for s, r in seeds.items():
            ref = runs[reference].get(s)
            if ref is not None:
                rv = dict(ref["val"])
                gaps.append([(t, v - rv[t]) for t, v in r["val"] if t in rv])
        g = mean_curve(gaps)
        b.plot([t for t, _ in g], [x for _, x in g], style, label=label)
    lo = min(v for seeds in runs.values() for r in seeds.values() for _, v in r["val"][-1:])
    a.set_ylim(lo - 0.05, lo + 1.0)
    a.set_title("validation loss (mean over seeds)")
    b.set_title(f"validation loss minus {reference}, same seed")
    b.axhline(0, color="k", lw=0.5)
    for ax in (a, b):
        ax.set_xlabel("tokens")
        ax.grid(alpha=0.3)
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    return png

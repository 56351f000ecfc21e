"""The small-scale ablation of the study's claims, several seeds, side by side on the GPUs of one
host. The plans (``PLANS``):

* v1 (results/ablation, withdrawn in part): the Fprop -> Dgrad -> Wgrad ladder and the Wgrad
  interventions with MXFP4 everywhere, 100 M tokens, seeds added to some arms;
* v2 (results/ablation_v2/PLAN.md, issue 16): Wgrad-only arms against bf16, every arm with the
  same three paired seeds, 250 M tokens of a corpus never repeated, sequences shuffled,
  validation spread over the corpus, a warm-up / stable / decay schedule, and its endpoints
  computed by ``summarize_v2`` from both evaluation fields (val_loss: bf16 forward of the
  master weights; val_loss_recipe: the recipe's own forward);
* v2-125m: v2's next stage (the three Wgrad arms at 125m, everything else v2's).

``run_ablation`` runs a list of (arm, seed) training runs, each an ``ocpmx train`` process with
``--resume`` in ``OUT/<arm>/seed<k>`` (a cut-off run continues from its last checkpoint, a
finished one is skipped), ``per_gpu`` at a time on each GPU; ``stop_after`` seconds ends the
batch (the runs still going are stopped and resume at the next call). Same seed = same initial
weights and same data order in every arm. ``summarize`` (v1) and ``summarize_v2`` read the runs
back and write the table (Markdown and JSON) and the plots.
"""
from __future__ import annotations

import json
import math
import os
import re
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

# ---- plan v2 (results/ablation_v2/PLAN.md): fixed before any run ---------------------------------
V2_PRIMARY = ("bf16", "mxfp4_wgrad", "mxfp4_wgrad_h16", "mxfp4_all", "mxfp4_all_h16")
V2_SECONDARY = ("mxfp4_wgrad_rht", "mxfp4_wgrad_sr")
V2_ARMS = V2_PRIMARY + V2_SECONDARY
V2_SEEDS = (0, 1, 2)
V2_STEPS = 3815          # x 65,536 tokens = 250.0 M tokens per run
V2_TOKENS_PER_STEP = 65_536
# the checkpoints of bf16 seed 0 kept for the mechanism analysis: after 25%, 50% (and 100%)
V2_ANALYSIS_STEPS = (round(0.25 * V2_STEPS) - 1, round(0.5 * V2_STEPS) - 1)
V2_TRAIN_ARGS = ("--preset", "30m", "--seq-len", "1024", "--batch-size", "32",
                 "--grad-accum", "2", "--lr", "1e-3", "--min-lr-ratio", "0.1",
                 "--warmup-steps", "100", "--schedule", "wsd", "--decay-fraction", "0.2",
                 "--max-steps", str(V2_STEPS), "--data-order", "sequences",
                 "--eval-sampling", "spread", "--eval-every", "50", "--eval-sequences", "256",
                 "--save-every", "100", "--keep", "1", "--compile", "--no-progress",
                 "--no-tensorboard")
# bf16 seed 2 keeps them too: the mechanism analysis runs on it, in the hold that trains it
# (PLAN.md, deviations of the eleventh session); seed 0's were lost with its machine
V2_MECHANISM_RUN = ("bf16", 2)
V2_EXTRA_ARGS = {k: ("--keep-steps", *map(str, V2_ANALYSIS_STEPS))
                 for k in (("bf16", 0), V2_MECHANISM_RUN)}
# endpoints: (name, arm, minus arm); the first two are primary
V2_ENDPOINTS = (("wgrad_cost", "mxfp4_wgrad", "bf16"),
                ("h16_on_wgrad", "mxfp4_wgrad_h16", "mxfp4_wgrad"),
                ("all_cost", "mxfp4_all", "bf16"),
                ("h16_on_all", "mxfp4_all_h16", "mxfp4_all"),
                ("rht_on_wgrad", "mxfp4_wgrad_rht", "mxfp4_wgrad"),
                ("sr_on_wgrad", "mxfp4_wgrad_sr", "mxfp4_wgrad"))
V2_PRIMARY_ENDPOINTS = ("wgrad_cost", "h16_on_wgrad")
V2_TARGET_FRACTION = 0.4  # the target: bf16's mean val_loss at 40% of the budget (stable phase)
# an endpoint judged only if another's verdict is 'present' (PLAN.md, Decision rule)
V2_GATES = {"h16_on_wgrad": "wgrad_cost"}
V2_MARGIN = 0.03          # smallest loss difference of interest (decision rule)
V2_FLOOR = 0.009          # two trainings of one seed differed by this much (results/ablation)


def plan(arms=ARMS, seeds=(0, 1, 2), seeded=SEEDED_ARMS) -> list[tuple[str, int]]:
    """(arm, seed) pairs: every arm with seed 0 first, then the extra seeds of ``seeded``, so a
    run cut short by the budget loses extra seeds before arms."""
    runs = [(a, seeds[0]) for a in arms]
    runs += [(a, s) for s in seeds[1:] for a in arms if a in seeded]
    return runs


def plan_v2(arms=V2_ARMS, seeds=V2_SEEDS) -> list[tuple[str, int]]:
    """Every arm with every seed (no arm gets seeds the others lack), in complete paired blocks:
    the primary arms seed by seed, then the secondary arms seed by seed, so a batch cut short
    loses whole secondary blocks first and never leaves a comparison unpaired."""
    primary = [a for a in arms if a in V2_PRIMARY]
    secondary = [a for a in arms if a not in V2_PRIMARY]
    return [(a, s) for s in seeds for a in primary] + [(a, s) for s in seeds for a in secondary]


# the rule's next stage once wgrad_cost is present (PLAN.md, "Stage 2", fixed before any of its
# runs): the three Wgrad arms at 125m, every other option the 30m block's, so model size is the
# one change
V2_125M_ARMS = ("bf16", "mxfp4_wgrad", "mxfp4_wgrad_h16")
V2_125M_TRAIN_ARGS = tuple("125m" if a == "30m" else a for a in V2_TRAIN_ARGS)

PLANS = {
    "v1": {"arms": ARMS, "plan": plan, "train_args": DEFAULT_TRAIN_ARGS, "extra_args": {}},
    "v2": {"arms": V2_ARMS, "plan": plan_v2, "train_args": V2_TRAIN_ARGS,
           "extra_args": V2_EXTRA_ARGS},
    "v2-125m": {"arms": V2_125M_ARMS, "plan": plan_v2, "train_args": V2_125M_TRAIN_ARGS,
                "extra_args": {}},
}


def run_dir(out, arm: str, seed: int) -> Path:
    return Path(out) / arm / f"seed{seed}"


def run_status(d: Path) -> str | None:
    f = d / "status.json"
    return json.loads(f.read_text())["status"] if f.is_file() else None


# a run whose metrics hold its last step's training row and evaluation, but no status.json: the
# driver never saw its process exit (results/ablation_v2, hold 6: the process had not exited
# three minutes after its final evaluation when the machine went back). Its endpoints exist;
# its final checkpoint and exit code are unknown, and the tables say so.
EXIT_NOT_SEEN = "finished (exit not seen)"
FINISHED = ("done", "diverged", EXIT_NOT_SEEN)


def _status_from_metrics(d: Path, train: list[dict], val: list[dict]) -> str:
    """EXIT_NOT_SEEN when the metrics reach config.json's last step (trained and evaluated),
    else "incomplete"."""
    cfg = d / "config.json"
    last = json.loads(cfg.read_text()).get("max_steps") if cfg.is_file() else None
    if last and train[-1]["step"] == last - 1 and any(r["step"] == last - 1 for r in val):
        return EXIT_NOT_SEEN
    return "incomplete"


# a progress or evaluation line of ``ocpmx train``'s log: "HH:MM:SS step N/M ..."
_LOG_STEP = re.compile(r"^(\d\d):(\d\d):(\d\d) step (\d+)/(\d+)\b")


def wall_eta(log_lines, window_s: float = 300.0):
    """How long a run still needs, from its log.txt alone: its wall-clock rate over the last
    ``window_s`` seconds of logged steps, evaluations, compiles and any sharing of the GPU
    included (the tokens/s of metrics.jsonl counts training steps only: the 125m
    ``mxfp4_wgrad`` seed-0 log spans 20 min for 16 min of steps, results/ablation_v2 hold 6).

    Returns (steps per second, seconds left to the last step, time of the last line in seconds
    of its day), or None with fewer than two step lines. Times wrap past midnight."""
    points, day, prev = [], 0, None
    for line in log_lines:
        m = _LOG_STEP.match(line)
        if not m:
            continue
        t = int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3])
        if prev is not None and t + day < prev - 43200:  # the clock passed midnight
            day += 86400
        prev = t + day
        points.append((prev, int(m[4]), int(m[5])))
    if not points:
        return None
    t_end, step, total = points[-1]
    earlier = [p for p in points if p[1] < step]  # an evaluation line repeats its step
    if not earlier:
        return None
    t0, s0, _ = next((p for p in earlier if p[0] >= t_end - window_s), earlier[-1])
    if t_end <= t0:
        return None
    rate = (step - s0) / (t_end - t0)
    return rate, (total - step) / rate, t_end % 86400


def gpu_slots(gpus: list[str], per_gpu: int) -> list[str]:
    """One entry per concurrent run, round-robin over the GPUs, so that runs started together
    (the arms in plan order) spread over all GPUs instead of filling the first one."""
    return [g for _ in range(per_gpu) for g in gpus] or ["cpu"]


def _check_same_stage(d: Path, train_args) -> None:
    """A finished run counts only for the plan it was trained under: its model preset and
    step count must be the ones ``train_args`` asks for (a 30m run in a 125m batch's folder
    would otherwise be skipped as done)."""
    cfg = json.loads((d / "config.json").read_text()) if (d / "config.json").is_file() else {}
    for opt, key in (("--preset", "preset"), ("--max-steps", "max_steps")):
        if opt in train_args and key in cfg:
            want = train_args[list(train_args).index(opt) + 1]
            if str(cfg[key]) != str(want):
                raise ValueError(f"{d} holds a run with {key} {cfg[key]!r}, not the {want!r} "
                                 f"this plan trains: use another --out for this plan")


def run_ablation(out, runs, data: str, gpus: list[str], per_gpu: int = 1,
                 train_args=DEFAULT_TRAIN_ARGS, poll_s: float = 5.0, extra_args=None,
                 stop_after: float | None = None) -> dict:
    """Run ``runs`` ((arm, seed) pairs) as ``ocpmx train`` processes, ``per_gpu`` at a time per
    GPU (CUDA_VISIBLE_DEVICES), each resumable; returns {run dir: status}. ``extra_args``:
    {(arm, seed): more options for that run}. ``stop_after``: seconds after which no run starts
    and the running ones are stopped (SIGTERM; status 'stopped', no status.json: the next call
    resumes them from their last checkpoint), for device calls of limited length."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    extra_args = extra_args or {}
    t_start = time.time()
    results = {str(run_dir(out, *r)): run_status(run_dir(out, *r)) for r in runs}
    for d, st in results.items():
        if st is not None:
            _check_same_stage(Path(d), train_args)
    todo = [r for r in runs if results[str(run_dir(out, *r))] not in ("done", "diverged")]
    slots = gpu_slots(gpus, per_gpu)
    threads = str(max(1, (os.cpu_count() or 1) // len(slots)))
    active: dict[str, tuple] = {}

    def command(arm, seed):
        return [sys.executable, "-m", "ocpmx.cli", "train", *train_args,
                *extra_args.get((arm, seed), ()), "--data", data, "--recipe", arm,
                "--seed", str(seed), "--out", str(run_dir(out, arm, seed)), "--resume"]
    (out / "commands.txt").write_text("".join(" ".join(command(a, s)) + "\n" for a, s in runs))
    while todo or active:
        if stop_after is not None and time.time() - t_start > stop_after:
            for i, (proc, d, log, t0) in list(active.items()):
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                log.close()
                results[str(d)] = "stopped"
                print(f"stopped: {d} ({time.time() - t0:.0f} s)", flush=True)
            active.clear()
            break
        free = [i for i in range(len(slots)) if i not in active]
        while todo and free:
            i = free.pop(0)
            arm, seed = todo.pop(0)
            d = run_dir(out, arm, seed)
            d.mkdir(parents=True, exist_ok=True)
            cmd = command(arm, seed)
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
    """{arm: {seed: {"val": [(tokens, loss)], "val_recipe": [(tokens, loss)], "train":
    [(tokens, loss)], "legacy_eval", "status", ...}}}. "val" is the field val_loss: the bf16
    forward of the master weights, except in runs from before the two fields ("legacy_eval"),
    where it is the recipe's forward; "val_recipe" is the recipe's forward in both."""
    from .metrics import read_metrics
    runs: dict[str, dict[int, dict]] = {}
    for m in sorted(Path(out).glob("*/seed*/metrics.jsonl")):
        arm, seed = m.parent.parent.name, int(m.parent.name[4:])
        train, val = read_metrics(m)
        if not train:
            continue
        status = run_status(m.parent) or _status_from_metrics(m.parent, train, val)
        legacy = bool(val) and not any("val_loss_recipe" in r for r in val)
        epoch = None  # the data stream's epoch at the last checkpoint: 1 or more = repeated data
        latest = m.parent / "checkpoints" / "latest"
        if latest.is_file():
            st = m.parent / "checkpoints" / latest.read_text().strip() / "state.json"
            if st.is_file():
                epoch = json.loads(st.read_text()).get("data", {}).get("epoch")
        runs.setdefault(arm, {})[seed] = {
            "val": [(r["tokens"], r["val_loss"]) for r in val],
            "val_recipe": [(r["tokens"], r.get("val_loss_recipe", r["val_loss"])) for r in val],
            "legacy_eval": legacy, "data_epoch": epoch,
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
        finals, finals_r, extras, flags, gaps, deltas = [], [], [], [], [], []
        complete = {s: r for s, r in seeds.items() if r["status"] in ("done", "diverged")}
        for s, r in sorted(seeds.items()):
            if s not in complete:  # cut off: its curve so far is plotted, not tabulated
                flags.append(f"seed {s}: {r['status']} at {r['tokens'] / 1e6:.0f} M tokens")
                continue
            finals.append(r["val"][-1][1] if r["val"] else None)
            finals_r.append(r["val_recipe"][-1][1] if r["val_recipe"] else None)
            if r["legacy_eval"]:
                flags.append(f"seed {s}: val_loss is the recipe's forward (before issue 16)")
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
        frm, frs = _mean_std(finals_r)
        em, es = _mean_std(extras)
        dm, ds = _mean_std(deltas)
        rows.append({"arm": arm, "seeds": sorted(complete), "incomplete": sorted(set(seeds) - set(complete)),
                     "final_val_loss": finals,
                     "delta_vs_reference": deltas, "delta_mean": dm, "delta_std": ds,
                     "final_val_loss_mean": fm, "final_val_loss_std": fs,
                     "final_val_loss_recipe": finals_r, "final_val_loss_recipe_mean": frm,
                     "final_val_loss_recipe_std": frs,
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
             "val loss: the master weights through a bf16 forward (runs from before issue 16: "
             "the recipe's forward, flagged); recipe fwd: the arm's own forward.", "",
             "| arm | seeds | final val loss | Δ final | extra tokens | max gap | flags | "
             "final val loss, recipe fwd |",
             "|---|---|---|---|---|---|---|---|"]
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
                     f"{_pm(r['delta_mean'], r['delta_std'], '+.4f')} | {extra} | {gap} | "
                     f"{'; '.join(r['flags']) or '—'} | "
                     f"{_pm(r['final_val_loss_recipe_mean'], r['final_val_loss_recipe_std'], '.4f')} |")
    return "\n".join(lines) + "\n"


def plot_ablation(runs, png, reference: str = "bf16", order=ARMS, solid=SEEDED_ARMS):
    """Validation loss against tokens (mean over the seeds that reached each evaluation) for every
    arm, and the gap to the reference: at each evaluation the mean over seeds of the arm's loss
    minus the same seed's reference loss (same data order). Top row: val_loss (the bf16 forward
    of the master weights; the recipe's forward in runs from before the two fields); bottom row:
    val_loss_recipe (the arm's own forward)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 2, figsize=(13, 10))
    for row, (key, what) in enumerate((("val", "val_loss (bf16 forward)"),
                                       ("val_recipe", "val_loss_recipe (own forward)"))):
        _plot_field(axes[row], runs, key, what, reference, order, solid)
    axes[0][1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png


def _plot_field(ax_pair, runs, key, what, reference, order, solid):
    """One row of ``plot_ablation``: the mean over seeds, and where an arm has two or more seeds
    a band from the lowest to the highest seed at each evaluation (the seed spread)."""
    a, b = ax_pair

    def mean_curve(curves):
        at: dict[int, list[float]] = {}
        for c in curves:
            for t, v in c:
                at.setdefault(t, []).append(v)
        return sorted((t, sum(v) / len(v), min(v), max(v), len(v)) for t, v in at.items())

    def draw(ax, c, style, label):
        line, = ax.plot([x[0] for x in c], [x[1] for x in c], style, label=label)
        band = [x for x in c if x[4] > 1]
        if band:
            ax.fill_between([x[0] for x in band], [x[2] for x in band], [x[3] for x in band],
                            color=line.get_color(), alpha=0.15, lw=0)

    for arm in [x for x in order if x in runs] + [x for x in runs if x not in order]:
        seeds = runs[arm]
        label = f"{arm} ({len(seeds)} seeds)" if len(seeds) > 1 else arm
        style = "-" if arm in solid else "--"
        draw(a, mean_curve([r[key] for r in seeds.values()]), style, label)
        if arm == reference:  # its gap is zero in every seed: the axis line, no band
            b.plot([], [], style, label=label)
            continue
        gaps = []
        for s, r in seeds.items():
            ref = runs.get(reference, {}).get(s)
            if ref is not None:
                rv = dict(ref[key])
                gaps.append([(t, v - rv[t]) for t, v in r[key] if t in rv])
        draw(b, mean_curve(gaps), style, label)
    finals = [v for seeds in runs.values() for r in seeds.values() for _, v in r[key][-1:]]
    if finals:
        a.set_ylim(min(finals) - 0.05, min(finals) + 1.0)
    a.set_title(f"{what}\nmean over seeds; band: lowest to highest seed", fontsize=10)
    b.set_title(f"{what} minus {reference}, same seed\nmean over seeds; band: seed spread", fontsize=10)
    b.axhline(0, color="k", lw=0.5)
    for ax in (a, b):
        ax.set_xlabel("tokens")
        ax.grid(alpha=0.3)


# ---- plan v2: the endpoints fixed in results/ablation_v2/PLAN.md ---------------------------------

# two-sided 95% quantiles of Student's t (df 1..30); larger df: the normal's
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_interval(xs) -> dict:
    """Mean, standard deviation and the 95% t-interval of paired differences (df n - 1); the
    interval is None for fewer than two."""
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    m, sd = _mean_std(xs)
    if m is None or sd is None:
        return {"n": len(xs), "mean": m, "sd": sd, "ci95": None}
    t = _T975[len(xs) - 2] if len(xs) - 1 <= len(_T975) else 1.96
    h = t * sd / math.sqrt(len(xs))
    return {"n": len(xs), "mean": m, "sd": sd, "ci95": [m - h, m + h]}


def verdict(name: str, est: dict, margin: float = V2_MARGIN, floor: float = V2_FLOOR) -> str:
    """The plan's decision rule for one paired endpoint (arm minus reference, final val_loss).
    A cost (wgrad_cost, all_cost): 'present' if the interval lies above 0 and the mean exceeds
    the floor; 'absent' if it lies below +margin; else 'inconclusive'. An intervention (the
    others, negative = better): 'helps' if the interval lies below 0 and the mean is below
    -floor; 'hurts' symmetrically; 'no effect' if it lies within (-margin, +margin); else
    'inconclusive'."""
    ci = est.get("ci95")
    if ci is None:
        return "not enough seeds"
    lo, hi = ci
    if name.endswith("_cost"):
        if lo > 0 and est["mean"] > floor:
            return "present"
        return "absent" if hi < margin else "inconclusive"
    if hi < 0 and est["mean"] < -floor:
        return "helps"
    if lo > 0 and est["mean"] > floor:
        return "hurts"
    return "no effect" if -margin < lo and hi < margin else "inconclusive"


def stated_verdict(e: dict, by_name: dict, n_planned: int = len(V2_SEEDS)) -> str:
    """What the table says for endpoint ``e``: the decision rule's outcome (``e['rule']``),
    marked provisional while fewer than the planned paired seeds exist, and withheld where the
    plan judges the endpoint only after another one's 'present' (V2_GATES): then it names the
    gate's state, never a verdict the plan does not allow."""
    gate = V2_GATES.get(e["endpoint"])
    why = []
    if gate is not None:
        g = by_name.get(gate)
        if g is None or g["rule"] != "present":
            state = "not run" if g is None else stated_verdict(g, by_name, n_planned)
            return f"not judged ({gate}: {state})"
        if g["val_loss"]["n"] < n_planned:  # judged on a gate that is itself provisional
            why.append(f"{gate} n = {g['val_loss']['n']} of {n_planned}")
    n = e["val_loss"]["n"]
    if e["rule"] == "not enough seeds":
        return e["rule"]
    if n < n_planned:
        why.insert(0, f"n = {n} of {n_planned}")
    return f"provisional: {e['rule']} ({'; '.join(why)})" if why else e["rule"]


def _complete(runs, arm):
    return {s: r for s, r in runs.get(arm, {}).items() if r["status"] in FINISHED}


def summarize_v2(out, target_fraction: float = V2_TARGET_FRACTION, reference: str = "bf16",
                 endpoints=V2_ENDPOINTS, write: bool = True, against=None) -> dict:
    """The plan's endpoints from the finished runs under ``out`` (OUT/v2_table.md / .json and
    OUT/val_loss_v2.png):

    * per arm: final val_loss (bf16 forward) and val_loss_recipe, mean and sd over seeds;
    * per endpoint (arm minus reference arm): the paired per-seed differences of the final
      val_loss and of val_loss_recipe, their mean, sd and 95% t-interval, and the decision
      rule's verdict (on val_loss);
    * tokens-to-target: the target is the mean over ``reference``'s seeds of its val_loss at
      ``target_fraction`` of the budget (one number for all arms and seeds); for every run the
      tokens at which its val_loss curve first reaches it (linear interpolation), and per arm
      the paired ratio to the same seed's reference minus 1 with its t-interval (None where a
      run never reaches the target: reported as not reached);
    * with ``against`` (another stage's folder: the 30m block, for Stage 2): each endpoint's
      mean here and there and their ratio, here / there (PLAN.md, Stage 2: reported beside the
      endpoints, with no verdict of its own; the stages' seeds are not paired)."""
    runs = load_runs(out)
    ref = _complete(runs, reference)
    if not ref:
        raise ValueError(f"no finished {reference!r} run under {out}")
    budget = max(r["tokens"] for r in ref.values())
    target = sum(_value_at(r["val"], target_fraction * budget) for r in ref.values()) / len(ref)
    arms = [a for a in V2_ARMS if a in runs] + [a for a in runs if a not in V2_ARMS]
    per_arm = {}
    for arm in arms:
        done = _complete(runs, arm)
        finals = {s: r["val"][-1][1] for s, r in done.items() if r["val"]}
        finals_r = {s: r["val_recipe"][-1][1] for s, r in done.items() if r["val_recipe"]}
        ttt = {s: _interp_tokens(r["val"], target) for s, r in done.items()}
        extra = {s: (None if ttt[s] is None or s not in ref or
                     _interp_tokens(ref[s]["val"], target) in (None, 0) else
                     ttt[s] / _interp_tokens(ref[s]["val"], target) - 1) for s in done}
        per_arm[arm] = {
            "seeds": sorted(done), "incomplete": sorted(set(runs[arm]) - set(done)),
            "legacy_eval": any(r["legacy_eval"] for r in done.values()),
            "final_val_loss": finals, "final_val_loss_recipe": finals_r,
            "val_loss": _mean_std(list(finals.values())),
            "val_loss_recipe": _mean_std(list(finals_r.values())),
            "tokens_to_target": ttt, "extra_tokens": extra,
            "extra_tokens_ci": t_interval([e for e in extra.values() if e is not None]),
            "not_reached": sorted(s for s, t in ttt.items() if t is None),
            "skipped_steps": {s: r["skipped"] for s, r in done.items() if r["skipped"]},
            "exit_not_seen": sorted(s for s, r in done.items() if r["status"] == EXIT_NOT_SEEN),
            "data_repeated": sorted(s for s, r in done.items() if (r["data_epoch"] or 0) >= 1)}
    results = []
    for name, arm, minus in endpoints:
        if arm not in per_arm or minus not in per_arm:
            continue
        a, b = per_arm[arm], per_arm[minus]
        seeds = sorted(set(a["final_val_loss"]) & set(b["final_val_loss"]))
        d = [a["final_val_loss"][s] - b["final_val_loss"][s] for s in seeds]
        dr = [a["final_val_loss_recipe"][s] - b["final_val_loss_recipe"][s] for s in seeds]
        est = t_interval(d)
        results.append({"endpoint": name, "arm": arm, "minus": minus, "seeds": seeds,
                        "primary": name in V2_PRIMARY_ENDPOINTS,
                        "differences": d, "val_loss": est,
                        "differences_recipe": dr, "val_loss_recipe": t_interval(dr),
                        "rule": verdict(name, est)})
    for e in results:
        e["verdict"] = stated_verdict(e, {r["endpoint"]: r for r in results})
    table = {"reference": reference, "budget_tokens": budget,
             "target_fraction": target_fraction, "target_val_loss": target,
             "margin": V2_MARGIN, "floor": V2_FLOOR, "arms": per_arm, "endpoints": results}
    if against is not None:
        other = {e["endpoint"]: e for e in
                 summarize_v2(against, target_fraction, reference, endpoints, write=False)[
                     "endpoints"]}
        table["against"] = str(against)
        table["scale"] = []
        for e in results:
            o = other.get(e["endpoint"])
            here, there = e["val_loss"]["mean"], o and o["val_loss"]["mean"]
            table["scale"].append({
                "endpoint": e["endpoint"], "here": e["val_loss"], "there": o and o["val_loss"],
                "ratio": None if here is None or not there else here / there})
    if write:
        Path(out, "v2_table.json").write_text(json.dumps(table, indent=1))
        Path(out, "v2_table.md").write_text(v2_markdown(table))
        plot_ablation(runs, Path(out) / "val_loss_v2.png", reference, order=V2_ARMS,
                      solid=V2_PRIMARY)
    return table


def _ci(e: dict, fmt: str = "+.4f", scale: float = 1.0) -> str:
    if e["mean"] is None:
        return "—"
    m = format(scale * e["mean"], fmt)
    if e["ci95"] is None:
        return f"{m} (n = {e['n']})"
    lo, hi = (format(scale * x, fmt) for x in e["ci95"])
    return f"{m} [{lo}, {hi}] (n = {e['n']})"


def v2_markdown(t: dict) -> str:
    lines = [f"Budget {t['budget_tokens']:,} tokens. val_loss: the master weights through a "
             "bf16 forward (the primary measure); val_loss_recipe: the arm's own forward. "
             f"Target for tokens-to-target: `{t['reference']}`'s mean val_loss at "
             f"{t['target_fraction']:.0%} of the budget = {t['target_val_loss']:.4f}. "
             "Intervals: 95% t-intervals over the paired seeds.", "",
             "| endpoint | arm − reference | Δ final val_loss [95% CI] | verdict | "
             "Δ final val_loss_recipe [95% CI] |", "|---|---|---|---|---|"]
    for e in t["endpoints"]:
        name = f"**{e['endpoint']}**" if e["primary"] else e["endpoint"]
        lines.append(f"| {name} | {e['arm']} − {e['minus']} | {_ci(e['val_loss'])} | "
                     f"{e['verdict']} | {_ci(e['val_loss_recipe'])} |")
    lines += ["", f"Decision rule (PLAN.md): margin {t['margin']}, floor {t['floor']}.", "",
              "| arm | seeds | final val_loss | final val_loss_recipe | extra tokens to target "
              "(vs same seed's reference) [95% CI] | flags |", "|---|---|---|---|---|---|"]
    for arm, a in t["arms"].items():
        flags = []
        if a["incomplete"]:
            flags.append(f"incomplete seeds {a['incomplete']}")
        if a["not_reached"]:
            flags.append(f"target not reached: seeds {a['not_reached']}")
        if a["skipped_steps"]:
            flags.append(f"skipped steps {a['skipped_steps']}")
        if a.get("exit_not_seen"):
            flags.append(f"exit not seen (metrics complete, final checkpoint unknown): seeds "
                         f"{a['exit_not_seen']}")
        if a["data_repeated"]:
            flags.append(f"data repeated (stream past epoch 0): seeds {a['data_repeated']}")
        if a["legacy_eval"]:
            flags.append("val_loss is the recipe's forward (run from before the two fields)")
        extra = _ci(a["extra_tokens_ci"], "+.1f", 100.0)
        lines.append(f"| {arm} | {len(a['seeds'])} | {_pm(*a['val_loss'], '.4f')} | "
                     f"{_pm(*a['val_loss_recipe'], '.4f')} | "
                     f"{extra if extra == '—' else extra.replace(' ', ' % ', 1)} | "
                     f"{'; '.join(flags) or '—'} |")
    if t.get("scale"):
        lines += ["", f"Against `{t['against']}` (another stage; PLAN.md Stage 2 reports the "
                  "ratio beside the endpoints, with no verdict of its own; the stages' seeds are "
                  "not paired):", "",
                  "| endpoint | Δ here [95% CI] | Δ there [95% CI] | ratio here / there |",
                  "|---|---|---|---|"]
        for r in t["scale"]:
            ratio = "—" if r["ratio"] is None else f"{r['ratio']:.2f}"
            there = "—" if r["there"] is None else _ci(r["there"])
            lines.append(f"| {r['endpoint']} | {_ci(r['here'])} | {there} | {ratio} |")
    return "\n".join(lines) + "\n"

"""Loss curves of run directories: loss in nats per token against tokens, the runs of one arm
(config.json equal but for the seed) drawn as their mean with the seeds' spread shaded,
validation points marked (an 8B run has a handful), explained events annotated."""
from __future__ import annotations

import json
import math
from pathlib import Path

from .metrics import read_metrics

LOSS_LABEL = "loss (nats per token)"


def _arm_key(run: Path) -> tuple[str, object]:
    """(what makes runs one arm: their config.json without seed and out, the seed); each run
    is its own arm when it has no config.json. An option a run's config.json lacks (it was
    written before the option existed) counts as that option's default, so a new option does
    not split an arm's older runs from its newer ones."""
    from .config import TrainConfig
    cfg_path = run / "config.json"
    if not cfg_path.is_file():
        return str(run), None
    cfg = {**TrainConfig().to_flat(), **json.loads(cfg_path.read_text())}
    cfg.pop("out", None)
    seed = cfg.pop("seed", None)
    return json.dumps(cfg, sort_keys=True), seed


def group_runs(runs: list[str]) -> list[tuple[str, list[Path]]]:
    """[(label, run directories)] in the order given: runs whose config.json differ only in
    the seed (and have different seeds) form one arm. A multi-seed arm is labelled by its runs'
    parent directory when they are OUT/<arm>/seed<k> (the ablation's layout), else by its first
    run, with the seed count."""
    groups: dict[str, list[Path]] = {}
    seeds: dict[str, set] = {}
    for r in runs:
        run = Path(r)
        if not (run / "metrics.jsonl").is_file():
            raise FileNotFoundError(f"no metrics.jsonl in {run}: not a run directory")
        key, seed = _arm_key(run)
        if seed is None or seed in seeds.get(key, ()):  # the same seed twice: two curves
            key = str(run)
        seeds.setdefault(key, set()).add(seed)
        groups.setdefault(key, []).append(run)
    out = []
    for members in groups.values():
        if len(members) == 1:
            out.append((members[0].name, members))
            continue
        seeded = all(m.name.startswith("seed") for m in members)
        name = members[0].parent.name if seeded else members[0].name
        out.append((f"{name} ({len(members)} seeds)", members))
    return out


def _spread(series: list[dict[float, float]]):
    """(tokens, mean, low, high) over the runs having a value at each token count (a run cut
    off sooner drops out of the later points); NaN values are left out."""
    xs = sorted({t for s in series for t in s})
    rows = []
    for t in xs:
        vals = [s[t] for s in series if t in s and math.isfinite(s[t])]
        if vals:
            rows.append((t, sum(vals) / len(vals), min(vals), max(vals)))
    return tuple(map(list, zip(*rows))) if rows else ([], [], [], [])


def loss_figure(runs: list[str], annotate=()):
    """The figure: train loss (left) and validation loss (right, markers at every evaluation)
    against tokens. val_loss (the master weights through a bf16 forward) solid, val_loss_recipe
    (the recipe's own forward) dashed where it differs. ``annotate``: [(tokens, text)], a dotted
    vertical line on both panels and the text on the train panel."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    both_fields = False
    for label, members in group_runs(runs):
        metrics = [read_metrics(m / "metrics.jsonl") for m in members]
        several = len(members) > 1
        both_fields |= any("val_loss_recipe" in r for _, v in metrics for r in v)
        x, mean, lo, hi = _spread([{r["tokens"]: r["loss"] for r in t} for t, _ in metrics])
        line, = a.plot(x, mean, lw=1.2, label=label)
        color = line.get_color()
        if several:
            a.fill_between(x, lo, hi, color=color, alpha=0.25, lw=0,
                           label=f"{label}: seed range")
        for key, style in (("val_loss", "-"), ("val_loss_recipe", "--")):
            series = [{r["tokens"]: r.get(key, r["val_loss"]) for r in v} for _, v in metrics]
            if key == "val_loss_recipe" and not any(
                    r.get(key, r["val_loss"]) != r["val_loss"] for _, v in metrics for r in v):
                continue  # the recipe's forward is the bf16 one
            x, mean, lo, hi = _spread(series)
            if not x:
                continue
            suffix = "" if key == "val_loss" else " (recipe's forward)"
            b.plot(x, mean, style, marker="o" if key == "val_loss" else "x", ms=6, mew=1.5,
                   color=color, label=label + suffix, zorder=3)
            if several:
                b.fill_between(x, lo, hi, color=color, alpha=0.2, lw=0)
                b.errorbar(x, mean, yerr=[[m - l for m, l in zip(mean, lo)],
                                          [h - m for m, h in zip(mean, hi)]],
                           fmt="none", ecolor=color, capsize=3, lw=1)  # one point: no band
    for tokens, text in annotate:
        for ax in (a, b):
            ax.axvline(tokens, color="0.4", ls=":", lw=1)
        a.annotate(text, xy=(tokens, 1), xycoords=("data", "axes fraction"),
                   xytext=(3, -3), textcoords="offset points", va="top", fontsize=8,
                   rotation=90, color="0.3")
    # runs logged before val_loss_recipe existed evaluated the recipe's own forward
    val_title = ("validation loss (bf16 forward; dashed: the recipe's own)" if both_fields
                 else "validation loss (the recipe's own forward, as logged)")
    for ax, title in ((a, "train loss"), (b, val_title)):
        ax.set_xlabel("tokens")
        ax.set_ylabel(LOSS_LABEL)
        ax.xaxis.set_major_formatter(EngFormatter())  # 100k, 10M, 1G
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot(runs: list[str], out_png: str, annotate=()):
    """``loss_figure`` saved to ``out_png``; returns the path."""
    fig = loss_figure(runs, annotate)  # selects the Agg backend before pyplot is imported
    import matplotlib.pyplot as plt
    fig.savefig(out_png, dpi=120)
    plt.close(fig)
    return out_png

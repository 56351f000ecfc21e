"""Loss curves of run directories."""
from __future__ import annotations

from pathlib import Path

from .metrics import read_metrics


def plot(runs: list[str], out_png: str):
    """Train and validation loss against tokens for several run directories: val_loss (the
    master weights through a bf16 forward) solid, val_loss_recipe (the recipe's own forward)
    dashed where it differs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        train_rows, val_rows = read_metrics(Path(r) / "metrics.jsonl")
        label = Path(r).name
        a.plot([x["tokens"] for x in train_rows], [x["loss"] for x in train_rows], label=label)
        if val_rows:
            line, = b.plot([x["tokens"] for x in val_rows], [x["val_loss"] for x in val_rows],
                           "o-", label=label)
            if any("val_loss_recipe" in x and x["val_loss_recipe"] != x["val_loss"]
                   for x in val_rows):
                b.plot([x["tokens"] for x in val_rows],
                       [x.get("val_loss_recipe", x["val_loss"]) for x in val_rows], "x--",
                       color=line.get_color(), label=f"{label} (recipe's forward)")
    for ax, t in ((a, "train loss"),
                  (b, "validation loss (bf16 forward; dashed: the recipe's own)")):
        ax.set_xlabel("tokens")
        ax.set_title(t)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    return out_png

"""A run's numbers: ``OUT/metrics.jsonl``, one JSON object per step (step, tokens, loss, lr,
grad_norm, tokens_per_s, mfu, skipped; max_mem_gb on a GPU; resumed: true on the first step of a
resumed process) and per evaluation (step, tokens, val_loss: the master weights through a bf16
forward, val_loss_recipe: the recipe's own forward; runs from before issue 16 have val_loss
alone, the recipe's forward); TensorBoard scalars in OUT/tb; a progress bar."""
from __future__ import annotations

import json
from pathlib import Path

TB_SCALARS = ("loss", "lr", "grad_norm", "tokens_per_s", "mfu")


class Metrics:
    """Where rank 0 writes a run's numbers: metrics.jsonl, TensorBoard (when the tensorboard
    package is installed) and a tqdm progress bar. Disabled (other ranks), it does nothing.

    ``resume_step``: the step of the checkpoint a run resumes from. The file keeps its rows up
    to that step (the rows of a run cut off after its checkpoint go) and is appended to;
    otherwise it is started afresh. ``progress``: (total steps, first step, label) for the bar,
    or None."""

    def __init__(self, out: Path, enabled: bool = True, resume_step: int | None = None,
                 tensorboard: bool = True, progress: tuple[int, int, str] | None = None):
        self.file = self.tb = self.bar = None
        if not enabled:
            return
        path = out / "metrics.jsonl"
        if resume_step is not None:
            rows = [l for l in path.read_text().splitlines()
                    if l and json.loads(l)["step"] <= resume_step]
            path.write_text("".join(r + "\n" for r in rows))
        self.file = open(path, "w" if resume_step is None else "a")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.tb = SummaryWriter(str(out / "tb"))
            except ImportError:
                print("tensorboard is not installed: metrics go to metrics.jsonl only")
        if progress:
            from tqdm import tqdm
            total, initial, label = progress
            self.bar = tqdm(total=total, initial=initial, desc=label)

    def log_step(self, row: dict) -> None:
        if self.file is not None:
            self.file.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k in TB_SCALARS:
                self.tb.add_scalar(f"train/{k}", row[k], row["tokens"])
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{row['tokens_per_s']:.0f}",
                                 mfu=f"{row['mfu']:.1%}")

    def log_eval(self, step: int, tokens: int, val_loss: float,
                 val_loss_recipe: float | None = None) -> None:
        """val_loss: the master weights through a bf16 forward; val_loss_recipe: the training
        recipe's own forward (runs from before the two fields logged the recipe's forward as
        val_loss alone)."""
        row = {"step": step, "tokens": tokens, "val_loss": val_loss}
        if val_loss_recipe is not None:
            row["val_loss_recipe"] = val_loss_recipe
        if self.file is not None:
            self.file.write(json.dumps(row) + "\n")
        if self.tb is not None:
            self.tb.add_scalar("eval/val_loss", val_loss, tokens)
            if val_loss_recipe is not None:
                self.tb.add_scalar("eval/val_loss_recipe", val_loss_recipe, tokens)

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()

    def close(self) -> None:
        for sink in (self.file, self.tb, self.bar):
            if sink is not None:
                sink.close()

    def __enter__(self) -> Metrics:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path) -> tuple[list[dict], list[dict]]:
    """(train rows, eval rows) of a metrics.jsonl."""
    rows = [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]
    return [r for r in rows if "loss" in r], [r for r in rows if "val_loss" in r]

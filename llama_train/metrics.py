"""A run's numbers: ``OUT/metrics.jsonl``, one JSON object per step (step, tokens, loss, lr,
grad_norm, tokens_per_s, mfu, skipped; max_mem_gb on a GPU; resumed: true on the first step of a
resumed process) and per evaluation (step, tokens, val_loss: the master weights through a bf16
forward, val_loss_recipe: the recipe's own forward; runs from before issue 16 have val_loss
alone, the recipe's forward); TensorBoard scalars in OUT/tb; a progress bar; a progress line
through Python ``logging`` (logger ``ocpmx.llama_train``) every ``log_every`` steps."""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

TB_SCALARS = ("loss", "lr", "grad_norm", "tokens_per_s", "mfu")
log = logging.getLogger(__name__.rsplit(".", 1)[0])  # ocpmx.llama_train


def crash_requested(point: str, step: int) -> bool:
    """Test hook: whether ``OCPMX_TEST_CRASH=POINT@STEP`` asks the process to kill itself at
    ``point`` of ``step`` (points: 'checkpoint-before-rename', 'metrics-append')."""
    return os.environ.get("OCPMX_TEST_CRASH") == f"{point}@{step}"


def crash() -> None:
    """SIGKILL this process (no cleanup, no buffers flushed): what a killed job sees."""
    os.kill(os.getpid(), signal.SIGKILL)


def setup_logging(level: int = logging.INFO) -> None:
    """A handler for the ``ocpmx.llama_train`` logger (once): time-stamped lines on stderr,
    written through tqdm so that they do not break a progress bar."""
    if log.handlers:
        return

    class Handler(logging.StreamHandler):
        def emit(self, record):
            try:
                from tqdm import tqdm
                tqdm.write(self.format(record), file=sys.stderr)
            except Exception:  # noqa: BLE001 - logging must never stop training
                self.handleError(record)
    h = Handler()
    h.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    log.addHandler(h)
    log.setLevel(level)


def stacks_on_signal() -> bool:
    """``kill -USR1 <pid>`` prints every thread's Python stack on stderr (a training process's
    log) without stopping it: how to see where a run that stopped logging waits (hold 6 of
    results/ablation_v2: a process alive minutes after its final evaluation). False where the
    platform has no SIGUSR1 or stderr is no file (captured in a test, say): nothing registered."""
    import faulthandler
    if not hasattr(signal, "SIGUSR1"):
        return False
    try:
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)
    except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation: no fileno
        return False
    return True


def _complete_rows(path: Path) -> list[str]:
    """The lines of a metrics.jsonl that are whole JSON objects: a line torn by a killed
    process (no newline at its end, or not parseable) is left out."""
    text = path.read_text() if path.is_file() else ""
    lines = text.split("\n")
    whole, torn = lines[:-1], lines[-1]  # the text after the last newline: torn (or empty)
    if torn:
        log.warning(f"{path}: dropped a torn last line ({len(torn)} characters)")
    rows = []
    for line in whole:
        if not line.strip():
            continue
        try:
            json.loads(line)
        except json.JSONDecodeError:
            log.warning(f"{path}: dropped an unreadable line: {line[:80]!r}")
            continue
        rows.append(line)
    return rows


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class Metrics:
    """Where rank 0 writes a run's numbers: metrics.jsonl, TensorBoard (when the tensorboard
    package is installed), a tqdm progress bar and a logged progress line. Disabled (other
    ranks), it does nothing.

    ``resume_step``: the step of the checkpoint a run resumes from. The file keeps its whole rows
    up to that step (the rows of a run cut off after its checkpoint go, and a line torn by a
    kill) and is appended to; otherwise it is started afresh. ``steps``: (first step, total
    steps) of this process; ``label`` names the run on the bar; ``progress``: show the bar;
    ``log_every``: a progress line every N steps (0: none)."""

    def __init__(self, out: Path, enabled: bool = True, resume_step: int | None = None,
                 tensorboard: bool = True, steps: tuple[int, int] = (0, 0), label: str = "",
                 progress: bool = False, log_every: int = 0):
        self.file = self.tb = self.bar = None
        self.start, self.total = steps
        self.log_every, self.last_val, self.last_row = log_every, None, None
        self.t0 = time.perf_counter()
        if not enabled:
            return
        path = out / "metrics.jsonl"
        if resume_step is not None:
            rows = [r for r in _complete_rows(path) if json.loads(r)["step"] <= resume_step]
            _write_atomically(path, "".join(r + "\n" for r in rows))  # a kill keeps the old
        self.file = open(path, "w" if resume_step is None else "a")
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
                self.tb = SummaryWriter(str(out / "tb"))
            except ImportError:
                log.info("tensorboard is not installed: metrics go to metrics.jsonl only")
        if progress:
            from tqdm import tqdm
            self.bar = tqdm(total=self.total, initial=self.start, desc=label)

    def _append(self, row: dict) -> None:
        line = json.dumps(row) + "\n"
        if crash_requested("metrics-append", row["step"]) and "loss" in row:
            self.file.write(line[:len(line) // 2])  # half a line reaches the disk
            self.file.flush()
            crash()
        self.file.write(line)

    def _postfix(self) -> None:
        """The bar's postfix: the last step's loss and lr, the last validation loss, speed."""
        row, post = self.last_row, {}
        if row is not None:
            post.update(loss=f"{row['loss']:.3f}", lr=f"{row['lr']:.2e}")
        if self.last_val is not None:
            post["val"] = f"{self.last_val:.3f}"
        if row is not None:
            post.update(tok_s=f"{row['tokens_per_s']:.0f}", mfu=f"{row['mfu']:.1%}")
        self.bar.set_postfix(post)

    def log_step(self, row: dict) -> None:
        if self.file is None:
            return
        self._append(row)
        if self.tb is not None:
            for k in TB_SCALARS:
                self.tb.add_scalar(f"train/{k}", row[k], row["tokens"])
        if self.bar is not None:
            self.bar.update(1)
            self.last_row = row
            self._postfix()
        step = row["step"]
        if self.log_every and ((step + 1) % self.log_every == 0 or step == self.total - 1):
            done = step + 1 - self.start
            eta = (time.perf_counter() - self.t0) / done * (self.total - step - 1)
            log.info(f"step {step + 1}/{self.total}  loss {row['loss']:.4f}  lr {row['lr']:.3e}  "
                     f"tokens/s {row['tokens_per_s']:,.0f}  "
                     f"ETA {timedelta(seconds=round(eta))}")

    def log_eval(self, step: int, tokens: int, val_loss: float,
                 val_loss_recipe: float | None = None) -> None:
        """val_loss: the master weights through a bf16 forward; val_loss_recipe: the training
        recipe's own forward (runs from before the two fields logged the recipe's forward as
        val_loss alone)."""
        row = {"step": step, "tokens": tokens, "val_loss": val_loss}
        if val_loss_recipe is not None:
            row["val_loss_recipe"] = val_loss_recipe
        if self.file is None:
            return
        self._append(row)
        self.last_val = val_loss
        if self.bar is not None:
            self._postfix()
        if self.log_every:
            log.info(f"step {step + 1}/{self.total}  validation loss {val_loss:.4f}" +
                     (f" (recipe's forward {val_loss_recipe:.4f})"
                      if val_loss_recipe is not None and val_loss_recipe != val_loss else ""))
        if self.tb is not None:
            self.tb.add_scalar("eval/val_loss", val_loss, tokens)
            if val_loss_recipe is not None:
                self.tb.add_scalar("eval/val_loss_recipe", val_loss_recipe, tokens)

    def flush(self, sync: bool = False) -> None:
        """Rows to the operating system (a killed process loses none of them); ``sync``: to
        the disk as well (before a checkpoint: the rows it covers survive a power loss)."""
        if self.file is not None:
            self.file.flush()
            if sync:
                os.fsync(self.file.fileno())

    def close(self) -> None:
        for sink in (self.file, self.tb, self.bar):
            if sink is not None:
                sink.close()

    def __enter__(self) -> Metrics:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path) -> tuple[list[dict], list[dict]]:
    """(train rows, eval rows) of a metrics.jsonl; a last line torn by a killed process is left
    out."""
    lines = [l for l in Path(path).read_text().splitlines() if l.strip()]
    rows = [json.loads(l) for l in lines[:-1]]
    if lines:
        try:
            rows.append(json.loads(lines[-1]))
        except json.JSONDecodeError:
            pass
    return [r for r in rows if "loss" in r], [r for r in rows if "val_loss" in r]

"""Llama 3.1 pretraining on the native backend: one process (CPU or one GPU), or many through
``torchrun`` with FSDP2 (``fully_shard`` on every block and the root; NCCL on GPUs, gloo on CPUs).
Every rank reads the same token stream and takes its slice of each global batch, so the data
position is one small state for all ranks; checkpoints hold full (unsharded) state dicts and move
between world sizes.

* fp32 master weights and AdamW state; bf16 autocast compute; every Linear an MXLinear with the
  chosen recipe except the output head (bf16), by ``convert_linears`` rules.
* AdamW (0.9, 0.95, eps 1e-5, weight decay 0.1 on matrices), clipping 1.0, linear warm-up then
  cosine to ``min_lr_ratio``; gradient accumulation.
* Metrics: ``OUT/metrics.jsonl``, one JSON object per step (step, tokens, loss, lr, grad_norm,
  tokens_per_s, mfu, skipped) and eval rows (step, tokens, val_loss).
* Checkpoints: ``OUT/checkpoints/step_XXXXXXXX/`` (model.safetensors, optimizer.safetensors,
  state.json with the data position and RNG states), written to a temporary directory and
  renamed, then ``OUT/checkpoints/latest`` is replaced atomically; the last ``keep`` stay.
  ``resume=True`` continues bit-exactly.
* NaN/Inf loss or gradient norm: a clear message; policy 'stop' (raise, the last good checkpoint
  stays) or 'skip' (no update, counted in ``skipped``).
"""
from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..native import RECIPES, convert_linears, set_step
from .config import TRAIN_PRESETS, TrainConfig, TrainingDiverged, lr_at
from .data import TokenStream, load_tokenizer, validation_set
from .model import Llama, flops_per_token

PEAK_FLOPS = {"cpu": 1e11}  # nominal, for an MFU figure on CPU only


@dataclass
class Dist:
    """The process group: one process (world 1), or torchrun's ranks with FSDP2."""
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def mean(self, x: float) -> float:
        if self.world == 1:
            return x
        t = torch.tensor([x], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return float(t) / self.world

    def barrier(self):
        if self.world > 1:
            torch.distributed.barrier()


def setup_dist(device_name: str) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        name = device_name
        if name == "auto":
            name = "cuda" if torch.cuda.is_available() else "cpu"
        return Dist(0, 1, torch.device(name))
    use_cuda = torch.cuda.is_available() and device_name in ("auto", "cuda")
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if use_cuda else "gloo")
    rank, local = torch.distributed.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))
    if use_cuda:
        torch.cuda.set_device(local)
        return Dist(rank, world, torch.device("cuda", local))
    return Dist(rank, world, torch.device("cpu"))


def build(cfg: TrainConfig, dist: Dist):
    mcfg = cfg.validate()
    tok = load_tokenizer(cfg.tokenizer or Path(cfg.data) / "tokenizer.json")
    if tok.get_vocab_size() > mcfg.vocab_size:
        mcfg = replace(mcfg, vocab_size=tok.get_vocab_size())
    torch.manual_seed(cfg.seed)
    model = Llama(mcfg)
    model.init_weights(cfg.init_std, torch.Generator().manual_seed(cfg.seed))
    model.activation_checkpointing = cfg.activation_checkpointing
    convert_linears(model, cfg.recipe, rules=[(p, None) for p in cfg.keep_bf16], seed=cfg.seed,
                    backend=cfg.mx_backend)
    model.to(dist.device)
    if dist.world > 1:  # FSDP2: each block, then the root; fp32 shards, bf16 compute by autocast
        from torch.distributed.fsdp import fully_shard
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    return model, opt, tok, mcfg


# ---- checkpoints ---------------------------------------------------------------------------
# Full (unsharded) state dicts through torch.distributed.checkpoint.state_dict, on one process or
# many: optimizer state is keyed by parameter names, so a checkpoint moves between world sizes.

_SEP = "::"


def _full_state(model, opt):
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)
    o = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=o), get_optimizer_state_dict(model, opt, options=o)


def save_checkpoint(out: Path, step: int, model, opt, stream, tokens: int, skipped: int,
                    keep: int, dist: Dist):
    from safetensors.torch import save_file
    msd, osd = _full_state(model, opt)  # collective: every rank takes part
    if dist.main:
        root = out / "checkpoints"
        root.mkdir(parents=True, exist_ok=True)
        final = root / f"step_{step:08d}"
        tmp = root / f".tmp_step_{step:08d}_{os.getpid()}"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        save_file({k: v.detach().cpu().contiguous() for k, v in msd.items()},
                  str(tmp / "model.safetensors"))
        tensors, meta = {}, {"param_groups": osd["param_groups"], "state": {}}
        for name, st in osd["state"].items():
            meta["state"][name] = {}
            for k, v in st.items():
                if torch.is_tensor(v):
                    tensors[f"{name}{_SEP}{k}"] = v.detach().cpu().contiguous()
                else:
                    meta["state"][name][k] = v
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        rng = {"torch": torch.get_rng_state().tolist()}
        state = {"step": step, "tokens": tokens, "skipped": skipped, "data": stream.state(),
                 "rng": rng, "world": dist.world, "optimizer": meta}
        (tmp / "state.json").write_text(json.dumps(state))
        for f in tmp.iterdir():  # contents on disk before the rename makes them visible
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        latest_tmp = root / f".latest_{os.getpid()}"
        latest_tmp.write_text(final.name)
        os.replace(latest_tmp, root / "latest")
        done = sorted(p for p in root.glob("step_*") if p.is_dir())
        for old in done[:-keep]:
            shutil.rmtree(old)
    dist.barrier()


def load_checkpoint(out: Path, model, opt, dist: Dist):
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)
    latest = out / "checkpoints" / "latest"
    if not latest.is_file():
        return None
    path = out / "checkpoints" / latest.read_text().strip()
    state = json.loads((path / "state.json").read_text())
    msd = load_file(str(path / "model.safetensors"))
    osd = {"param_groups": state["optimizer"]["param_groups"],
           "state": {n: dict(st) for n, st in state["optimizer"]["state"].items()}}
    for key, v in load_file(str(path / "optimizer.safetensors")).items():
        name, k = key.rsplit(_SEP, 1)
        osd["state"].setdefault(name, {})[k] = v
    o = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, msd, options=o)
    set_optimizer_state_dict(model, opt, osd, options=o)
    torch.set_rng_state(torch.tensor(state["rng"]["torch"], dtype=torch.uint8))
    return state


# ---- the loop ------------------------------------------------------------------------------

def loss_fn(model, batch, device):
    batch = batch.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logits = model(batch[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model, val, dist: Dist, batch_size: int) -> float:
    """Mean validation loss; under FSDP every rank takes a slice of the set."""
    model.eval()
    mine = val[dist.rank::dist.world]
    total = 0.0
    for i in range(0, len(mine), batch_size):
        chunk = mine[i:i + batch_size]
        total += float(loss_fn(model, chunk, dist.device)) * len(chunk)
    model.train()
    return dist.mean(total) * dist.world / len(val)


def _norm(x) -> float:
    x = x.full_tensor() if hasattr(x, "full_tensor") else x
    return float(x)


def train(cfg: TrainConfig, resume: bool = False) -> dict:
    dist = setup_dist(cfg.device)
    device = dist.device
    out = Path(cfg.out)
    model, opt, tok, mcfg = build(cfg, dist)  # validates the configuration first
    if dist.main:
        out.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    state = load_checkpoint(out, model, opt, dist) if resume else None
    if resume and state is None and dist.main:
        print(f"no checkpoint in {out}/checkpoints: starting from step 0")
    start = state["step"] + 1 if state else 0
    tokens = state["tokens"] if state else 0
    skipped = state["skipped"] if state else 0
    stream = TokenStream(cfg.data, tok, cfg.seq_len, cfg.seed, state["data"] if state else None)
    val = validation_set(cfg.data, tok, cfg.seq_len, cfg.eval_sequences)
    metrics = None
    if dist.main:
        (out / "config.json").write_text(json.dumps({**asdict(cfg), "model": asdict(mcfg),
                                                     "world": dist.world}, indent=1))
        if resume and state:  # drop rows of steps past the checkpoint (a run cut off after it)
            rows = [l for l in (out / "metrics.jsonl").read_text().splitlines()
                    if l and json.loads(l)["step"] <= state["step"]]
            (out / "metrics.jsonl").write_text("".join(r + "\n" for r in rows))
        metrics = open(out / "metrics.jsonl", "a" if (resume and state) else "w")
    tb = None
    if dist.main and cfg.tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter
            tb = SummaryWriter(str(out / "tb"))
        except ImportError:
            print("tensorboard is not installed: metrics go to metrics.jsonl only")
    step_model = torch.compile(model) if cfg.compile else model
    fpt = flops_per_token(mcfg, cfg.seq_len)
    peak = (PEAK_FLOPS.get(device.type) or _gpu_peak(device)) * dist.world
    bar = None
    if cfg.progress and dist.main:
        from tqdm import tqdm
        bar = tqdm(total=cfg.max_steps, initial=start, desc=f"{cfg.preset}/{cfg.recipe}")
    result = {"tokens_to_target": None}
    params = list(model.parameters())
    lo, hi = dist.rank * cfg.batch_size, (dist.rank + 1) * cfg.batch_size
    for step in range(start, cfg.max_steps):
        t0 = time.perf_counter()
        lr = lr_at(step, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        loss_sum = 0.0
        for micro in range(cfg.grad_accum):
            set_step(model, step, micro)
            batch = stream.next_batch(cfg.batch_size * dist.world)[lo:hi]  # same stream everywhere
            loss = loss_fn(step_model, batch, device)
            (loss / cfg.grad_accum).backward()
            loss_sum += float(loss.detach())
        loss_val = dist.mean(loss_sum / cfg.grad_accum)
        grad_norm = _norm(torch.nn.utils.clip_grad_norm_(params, cfg.clip))
        step_tokens = cfg.batch_size * cfg.grad_accum * cfg.seq_len * dist.world
        if not (math.isfinite(loss_val) and math.isfinite(grad_norm)):
            opt.zero_grad(set_to_none=True)
            msg = (f"step {step}: non-finite {'loss' if not math.isfinite(loss_val) else 'gradient norm'}"
                   f" (loss {loss_val}, grad_norm {grad_norm})")
            if cfg.nan_policy == "stop":
                if metrics:
                    metrics.close()
                raise TrainingDiverged(msg + f"; the last good checkpoint is kept in {out}/checkpoints")
            skipped += 1
            if dist.main:
                print(msg + f"; step skipped ({skipped} so far)")
        else:
            opt.step()
            opt.zero_grad(set_to_none=True)
        tokens += step_tokens
        dt = time.perf_counter() - t0
        row = {"step": step, "tokens": tokens, "loss": loss_val, "lr": lr, "grad_norm": grad_norm,
               "tokens_per_s": step_tokens / dt, "mfu": step_tokens * fpt / dt / peak,
               "skipped": skipped}
        if metrics:
            metrics.write(json.dumps(row) + "\n")
        if tb:
            for k in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu"):
                tb.add_scalar(f"train/{k}", row[k], tokens)
        if bar:
            bar.update(1)
            bar.set_postfix(loss=f"{loss_val:.3f}", tok_s=f"{row['tokens_per_s']:.0f}",
                            mfu=f"{row['mfu']:.1%}")
        last = step == cfg.max_steps - 1
        stop = False
        if (step + 1) % cfg.eval_every == 0 or last:
            vl = evaluate(model, val, dist, cfg.batch_size)
            if metrics:
                metrics.write(json.dumps({"step": step, "tokens": tokens, "val_loss": vl}) + "\n")
            if tb:
                tb.add_scalar("eval/val_loss", vl, tokens)
            if cfg.target_loss is not None and vl <= cfg.target_loss:
                result["tokens_to_target"] = tokens
                stop = True
        if metrics:
            metrics.flush()
        if (step + 1) % cfg.save_every == 0 or last or stop:
            save_checkpoint(out, step, model, opt, stream, tokens, skipped, cfg.keep, dist)
        if stop:
            break
    if metrics:
        metrics.close()
    if tb:
        tb.close()
    if bar:
        bar.close()
    result.update(tokens=tokens, skipped=skipped, world=dist.world)
    return result


def _gpu_peak(device) -> float:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    return 989e12 if ("H100" in name or "H200" in name) else 312e12


def read_metrics(path) -> tuple[list[dict], list[dict]]:
    rows = [json.loads(l) for l in Path(path).read_text().splitlines() if l.strip()]
    return [r for r in rows if "loss" in r], [r for r in rows if "val_loss" in r]


def plot(runs: list[str], out_png: str):
    """Train and validation loss against tokens for several run directories."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        train_rows, val_rows = read_metrics(Path(r) / "metrics.jsonl")
        label = Path(r).name
        a.plot([x["tokens"] for x in train_rows], [x["loss"] for x in train_rows], label=label)
        if val_rows:
            b.plot([x["tokens"] for x in val_rows], [x["val_loss"] for x in val_rows], "o-", label=label)
    for ax, t in ((a, "train loss"), (b, "validation loss")):
        ax.set_xlabel("tokens")
        ax.set_title(t)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    return out_png


__all__ = ["RECIPES", "TrainConfig", "TrainingDiverged", "TRAIN_PRESETS", "lr_at", "plot",
           "read_metrics", "train"]

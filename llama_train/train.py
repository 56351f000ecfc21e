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
  tokens_per_s, mfu, skipped; max_mem_gb on a GPU; resumed: true on the first step of a resumed
  process, whose time includes the restart) and eval rows (step, tokens, val_loss).
* Checkpoints: ``OUT/checkpoints/step_XXXXXXXX/`` (format 'full': model.safetensors and
  optimizer.safetensors gathered on rank 0; format 'sharded': torch.distributed.checkpoint files,
  every rank writing its own shards in parallel, which an 8B model needs: 96 GB of fp32 weights
  and AdamW state; both with state.json holding the data position and RNG states), written to a
  temporary directory and renamed, then ``OUT/checkpoints/latest`` is replaced atomically; the
  last ``keep`` stay. ``resume=True`` continues bit-exactly. Both formats load at another world
  size (DCP reshards).
* ``profile_step``: steps N and N+1 under torch.profiler on rank 0; OUT/step_breakdown.json has
  the GPU time per step by kernel category (GEMM, quantize, dequantize, attention,
  communication, other) and the top kernels. Peak memory per GPU: OUT/memory.json.
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
    # built on the meta device, sharded, then materialized: an 8B model never exists in full on
    # one device (fp32 weights alone are 32 GB)
    with torch.device("meta"):
        model = Llama(mcfg)
    model.activation_checkpointing = cfg.activation_checkpointing
    convert_linears(model, cfg.recipe, rules=[(p, None) for p in cfg.keep_bf16], seed=cfg.seed,
                    backend=cfg.mx_backend)
    if dist.world > 1:  # FSDP2: each block, then the root; fp32 shards, bf16 compute by autocast
        from torch.distributed.fsdp import fully_shard
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    model.to_empty(device=dist.device)
    # the initial weights are drawn on the device (CPU or the GPU), the same for any world size
    model.init_weights(cfg.init_std, torch.Generator(dist.device).manual_seed(cfg.seed))
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


def _sharded_state(model, opt):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)}


def save_checkpoint(out: Path, step: int, model, opt, stream, tokens: int, skipped: int,
                    keep: int, dist: Dist, fmt: str = "full"):
    root = out / "checkpoints"
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp_step_{step:08d}"
    if dist.main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    dist.barrier()
    state = {"step": step, "tokens": tokens, "skipped": skipped, "data": stream.state(),
             "rng": {"torch": torch.get_rng_state().tolist()}, "world": dist.world,
             "format": fmt}
    if fmt == "sharded":
        import torch.distributed.checkpoint as dcp
        dcp.save(_sharded_state(model, opt), checkpoint_id=str(tmp))  # collective
    else:
        from safetensors.torch import save_file
        msd, osd = _full_state(model, opt)  # collective: every rank takes part
        if dist.main:
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
            state["optimizer"] = meta
    dist.barrier()
    if dist.main:
        (tmp / "state.json").write_text(json.dumps(state))
        for f in [f for f in tmp.rglob("*") if f.is_file()]:  # on disk before the rename
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
    if state.get("format", "full") == "sharded":
        import torch.distributed.checkpoint as dcp
        sd = _sharded_state(model, opt)  # the templates: this run's shards
        dcp.load(sd, checkpoint_id=str(path))
        msd, osd, o = sd["model"], sd["optim"], None
    else:
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
    prof = None
    for step in range(start, cfg.max_steps):
        if step == cfg.profile_step and dist.main:
            prof = torch.profiler.profile(activities=_profiler_activities(device))
            prof.start()
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
                if prof is not None:
                    prof.stop()
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
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        row = {"step": step, "tokens": tokens, "loss": loss_val, "lr": lr, "grad_norm": grad_norm,
               "tokens_per_s": step_tokens / dt, "mfu": step_tokens * fpt / dt / peak,
               "skipped": skipped}
        if step == start and start > 0:
            row["resumed"] = True  # the first step of a resumed process: its time is not a step's
        if device.type == "cuda":
            row["max_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
        if prof is not None and step == cfg.profile_step + 1:
            prof = _finish_profile(prof, 2, out)
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
        if cfg.save_every and ((step + 1) % cfg.save_every == 0 or last or stop):
            save_checkpoint(out, step, model, opt, stream, tokens, skipped, cfg.keep, dist,
                            cfg.checkpoint_format)
        if stop:
            break
    if prof is not None:  # the run ended one step after profile_step started (a profiler left
        prof = _finish_profile(prof, 1, out)  # running at exit crashes the process)
    if metrics:
        metrics.close()
    if tb:
        tb.close()
    if bar:
        bar.close()
    result.update(tokens=tokens, skipped=skipped, world=dist.world)
    if device.type == "cuda":
        result["peak_memory_gb"] = _peak_memory(dist)
        if dist.main:
            (out / "memory.json").write_text(json.dumps(result["peak_memory_gb"], indent=1))
    return result


def _finish_profile(prof, steps: int, out: Path) -> None:
    prof.stop()
    (out / "step_breakdown.json").write_text(json.dumps(step_breakdown(prof, steps), indent=1))
    return None


def _peak_memory(dist: Dist) -> dict:
    """Peak allocated and reserved GPU memory of every rank, in GiB."""
    mine = torch.tensor([torch.cuda.max_memory_allocated(dist.device),
                         torch.cuda.max_memory_reserved(dist.device)],
                        dtype=torch.float64, device=dist.device) / 2**30
    if dist.world > 1:
        every = [torch.zeros_like(mine) for _ in range(dist.world)]
        torch.distributed.all_gather(every, mine)
    else:
        every = [mine]
    return {"allocated_gb": [float(t[0]) for t in every],
            "reserved_gb": [float(t[1]) for t in every]}


def _profiler_activities(device):
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return acts


# GPU kernels by name: first matching category wins
KERNEL_CATEGORIES = (
    ("communication", ("nccl",)),
    ("dequantize", ("dequantize_kernel",)),
    ("quantize", ("quantize_kernel", "quantize_rows32_kernel", "transpose_kernel")),
    ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "mx_gemm_kernel", "matmul")),
    ("attention", ("flash", "fmha", "attention", "attn")),
)


def kernel_category(name: str) -> str:
    low = name.lower()
    for cat, keys in KERNEL_CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def breakdown_from_kernels(kernels: list[tuple[str, float, int]], steps: int) -> dict:
    """GPU milliseconds per step by category from (kernel name, total microseconds, calls).
    Communication overlaps compute under FSDP2, so the categories may add up to more than the
    step time."""
    cats: dict[str, float] = {}
    for name, us, _ in kernels:
        c = kernel_category(name)
        cats[c] = cats.get(c, 0.0) + us / 1e3 / steps
    top = sorted(kernels, key=lambda k: -k[1])[:20]
    return {"steps": steps, "gpu_ms_per_step": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
            "top_kernels": [{"name": n[:160], "category": kernel_category(n),
                             "ms_per_step": us / 1e3 / steps, "calls_per_step": c / steps}
                            for n, us, c in top]}


def step_breakdown(prof, steps: int) -> dict:
    kernels = []
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", None)
        if us is None:
            us = getattr(e, "self_cuda_time_total", 0.0)
        if us and getattr(e, "device_type", None) is not None and \
                str(e.device_type).endswith("CUDA"):
            kernels.append((e.key, float(us), int(e.count)))
    return breakdown_from_kernels(kernels, steps)


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

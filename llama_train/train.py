"""Llama 3.1 pretraining on the native backend: one process (CPU or one GPU) here.

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

from ..native import RECIPES, convert_linears, get_recipe, set_step
from .data import TokenStream, load_tokenizer, validation_set
from .model import Llama, flops_per_token, get_config

PEAK_FLOPS = {"cpu": 1e11}  # nominal, for an MFU figure on CPU only


class TrainingDiverged(RuntimeError):
    pass


@dataclass
class TrainConfig:
    preset: str = "tiny"
    recipe: str = "bf16"
    out: str = "out/run"
    data: str = "data/c4-mini"
    tokenizer: str | None = None      # default: <data>/tokenizer.json
    max_steps: int = 100
    batch_size: int = 8                # sequences per micro-batch
    grad_accum: int = 1
    seq_len: int = 128
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    decay_steps: int | None = None     # cosine length; default max_steps
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-5
    clip: float = 1.0
    init_std: float = 0.02
    eval_every: int = 50
    eval_sequences: int = 16
    target_loss: float | None = None
    save_every: int = 50
    keep: int = 2
    seed: int = 0
    nan_policy: str = "stop"           # or 'skip'
    compile: bool = False
    activation_checkpointing: bool = False
    device: str = "auto"
    mx_backend: str | None = None      # MXLinear quantization: None (GPU: Triton, CPU: emulator)
    keep_bf16: list[str] = field(default_factory=lambda: ["output"])
    progress: bool = True

    def validate(self):
        cfg = get_config(self.preset)
        recipe = get_recipe(self.recipe)  # unknown recipe -> ValueError
        if recipe.uses_mx:
            for name, dim in (("dim", cfg.dim), ("ffn_dim", cfg.ffn_dim),
                              ("kv dim", cfg.n_kv_heads * cfg.head_dim)):
                if dim % 32:
                    raise ValueError(f"recipe {self.recipe} needs sizes divisible by 32; preset "
                                     f"{self.preset} has {name} = {dim}")
            if (self.batch_size * self.seq_len) % 32:
                raise ValueError(f"recipe {self.recipe}: Wgrad contracts over tokens; "
                                 f"batch_size * seq_len = {self.batch_size * self.seq_len} is not "
                                 "divisible by 32")
        if self.nan_policy not in ("stop", "skip"):
            raise ValueError(f"nan_policy must be 'stop' or 'skip', got {self.nan_policy!r}")
        if self.seq_len > cfg.max_seq_len:
            raise ValueError(f"seq_len {self.seq_len} exceeds the preset's {cfg.max_seq_len}")
        for n in ("max_steps", "batch_size", "grad_accum", "seq_len"):
            if getattr(self, n) < 1:
                raise ValueError(f"{n} must be >= 1")
        return cfg


# MLPerf Llama 3.1 8B (mlcommons/training small_llm_pretraining, AMD's submission settings)
TRAIN_PRESETS = {
    "mlperf": dict(preset="8b", seq_len=8192, batch_size=1, grad_accum=32, lr=8e-4,
                   min_lr_ratio=0.1, warmup_steps=64, decay_steps=1_200_000, weight_decay=0.1,
                   eval_every=384, eval_sequences=1024, target_loss=3.3),
}


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over warmup_steps, then cosine from lr to lr * min_lr_ratio."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    total = cfg.decay_steps or cfg.max_steps
    t = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    lo = cfg.lr * cfg.min_lr_ratio
    return lo + 0.5 * (cfg.lr - lo) * (1 + math.cos(math.pi * t))


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def build(cfg: TrainConfig, device):
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
    model.to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)
    return model, opt, tok, mcfg


# ---- checkpoints ---------------------------------------------------------------------------

def _optimizer_tensors(opt) -> tuple[dict, dict]:
    sd = opt.state_dict()
    tensors, meta = {}, {"param_groups": sd["param_groups"], "state": {}}
    for pid, st in sd["state"].items():
        meta["state"][str(pid)] = {}
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"{pid}.{k}"] = v.detach().cpu().contiguous()
            else:
                meta["state"][str(pid)][k] = v
    return tensors, meta


def save_checkpoint(out: Path, step: int, model, opt, stream, tokens: int, skipped: int,
                    keep: int):
    from safetensors.torch import save_file
    root = out / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:08d}"
    tmp = root / f".tmp_step_{step:08d}_{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
              str(tmp / "model.safetensors"))
    tensors, meta = _optimizer_tensors(opt)
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    rng = {"torch": torch.get_rng_state().tolist()}
    if torch.cuda.is_available():
        rng["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    state = {"step": step, "tokens": tokens, "skipped": skipped, "data": stream.state(),
             "rng": rng, "optimizer": meta}
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


def load_checkpoint(out: Path, model, opt, device):
    from safetensors.torch import load_file
    root = out / "checkpoints"
    latest = root / "latest"
    if not latest.is_file():
        return None
    path = root / latest.read_text().strip()
    model.load_state_dict({k: v.to(device) for k, v in load_file(str(path / "model.safetensors")).items()})
    state = json.loads((path / "state.json").read_text())
    tensors = load_file(str(path / "optimizer.safetensors"))
    meta = state["optimizer"]
    opt_state = {}
    for pid, st in meta["state"].items():
        opt_state[int(pid)] = dict(st)
    for key, v in tensors.items():
        pid, k = key.split(".", 1)
        opt_state.setdefault(int(pid), {})[k] = v.to(device) if k != "step" else v
    opt.load_state_dict({"state": opt_state, "param_groups": meta["param_groups"]})
    torch.set_rng_state(torch.tensor(state["rng"]["torch"], dtype=torch.uint8))
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["rng"]["cuda"]])
    return state


# ---- the loop ------------------------------------------------------------------------------

def loss_fn(model, batch, device):
    batch = batch.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logits = model(batch[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model, val, device, batch_size: int) -> float:
    model.eval()
    total, n = 0.0, 0
    for i in range(0, len(val), batch_size):
        chunk = val[i:i + batch_size]
        total += float(loss_fn(model, chunk, device)) * len(chunk)
        n += len(chunk)
    model.train()
    return total / n


def train(cfg: TrainConfig, resume: bool = False) -> dict:
    device = _device(cfg.device)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model, opt, tok, mcfg = build(cfg, device)
    state = load_checkpoint(out, model, opt, device) if resume else None
    if resume and state is None:
        print(f"no checkpoint in {out}/checkpoints: starting from step 0")
    start = state["step"] + 1 if state else 0
    tokens = state["tokens"] if state else 0
    skipped = state["skipped"] if state else 0
    stream = TokenStream(cfg.data, tok, cfg.seq_len, cfg.seed, state["data"] if state else None)
    val = validation_set(cfg.data, tok, cfg.seq_len, cfg.eval_sequences)
    (out / "config.json").write_text(json.dumps({**asdict(cfg), "model": asdict(mcfg)}, indent=1))
    metrics = open(out / "metrics.jsonl", "a" if resume else "w")
    if resume and state:  # drop rows of steps past the checkpoint (a run cut off after it)
        metrics.close()
        rows = [l for l in (out / "metrics.jsonl").read_text().splitlines()
                if l and json.loads(l)["step"] <= state["step"]]
        (out / "metrics.jsonl").write_text("".join(r + "\n" for r in rows))
        metrics = open(out / "metrics.jsonl", "a")
    step_model = torch.compile(model) if cfg.compile else model
    fpt = flops_per_token(mcfg, cfg.seq_len)
    peak = PEAK_FLOPS.get(device.type) or _gpu_peak(device)
    bar = None
    if cfg.progress:
        from tqdm import tqdm
        bar = tqdm(total=cfg.max_steps, initial=start, desc=f"{cfg.preset}/{cfg.recipe}")
    result = {"tokens_to_target": None}
    params = [p for p in model.parameters()]
    for step in range(start, cfg.max_steps):
        t0 = time.perf_counter()
        lr = lr_at(step, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        loss_sum = 0.0
        for micro in range(cfg.grad_accum):
            set_step(model, step, micro)
            loss = loss_fn(step_model, stream.next_batch(cfg.batch_size), device)
            (loss / cfg.grad_accum).backward()
            loss_sum += float(loss.detach())
        loss_val = loss_sum / cfg.grad_accum
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.clip))
        step_tokens = cfg.batch_size * cfg.grad_accum * cfg.seq_len
        if not (math.isfinite(loss_val) and math.isfinite(grad_norm)):
            opt.zero_grad(set_to_none=True)
            msg = (f"step {step}: non-finite {'loss' if not math.isfinite(loss_val) else 'gradient norm'}"
                   f" (loss {loss_val}, grad_norm {grad_norm})")
            if cfg.nan_policy == "stop":
                metrics.close()
                raise TrainingDiverged(msg + f"; the last good checkpoint is kept in {out}/checkpoints")
            skipped += 1
            print(msg + f"; step skipped ({skipped} so far)")
        else:
            opt.step()
            opt.zero_grad(set_to_none=True)
        tokens += step_tokens
        dt = time.perf_counter() - t0
        row = {"step": step, "tokens": tokens, "loss": loss_val, "lr": lr, "grad_norm": grad_norm,
               "tokens_per_s": step_tokens / dt, "mfu": step_tokens * fpt / dt / peak,
               "skipped": skipped}
        metrics.write(json.dumps(row) + "\n")
        if bar:
            bar.update(1)
            bar.set_postfix(loss=f"{loss_val:.3f}", tok_s=f"{row['tokens_per_s']:.0f}",
                            mfu=f"{row['mfu']:.1%}")
        last = step == cfg.max_steps - 1
        if (step + 1) % cfg.eval_every == 0 or last:
            vl = evaluate(model, val, device, cfg.batch_size)
            metrics.write(json.dumps({"step": step, "tokens": tokens, "val_loss": vl}) + "\n")
            if cfg.target_loss is not None and vl <= cfg.target_loss and result["tokens_to_target"] is None:
                result["tokens_to_target"] = tokens
                metrics.flush()
                save_checkpoint(out, step, model, opt, stream, tokens, skipped, cfg.keep)
                break
        metrics.flush()
        if (step + 1) % cfg.save_every == 0 or last:
            save_checkpoint(out, step, model, opt, stream, tokens, skipped, cfg.keep)
    metrics.close()
    if bar:
        bar.close()
    result.update(tokens=tokens, skipped=skipped)
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

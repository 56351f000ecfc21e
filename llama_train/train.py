"""Llama 3.1 pretraining on the native backend: one process (CPU or one GPU), or many through
``torchrun`` with FSDP2 (``fully_shard`` on every block and the root; NCCL on GPUs, gloo on CPUs).
Every rank reads the same token stream and takes its slice of each global batch, so the data
position is one small state for all ranks.

* fp32 master weights and AdamW state; bf16 autocast compute; every Linear an MXLinear with the
  chosen recipe except the output head (bf16), by ``convert_linears`` rules.
* AdamW (0.9, 0.95, eps 1e-5, weight decay 0.1 on matrices), clipping 1.0, linear warm-up then
  cosine to ``min_lr_ratio``; gradient accumulation.
* Outputs in OUT: config.json (the flat configuration, the model's, the world size),
  metrics.jsonl and tb/ (``metrics``), checkpoints/ (``checkpoint``; ``resume=True`` continues
  bit-exactly, at any world size), step_breakdown.json and memory.json (``profiling``).
* NaN/Inf loss or gradient norm: a clear message; policy 'stop' (raise, the last good checkpoint
  stays) or 'skip' (no update, counted in ``skipped``).
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..native import GEMMS, RECIPES, MXLinear, convert_linears, fold, set_step
from ..native.gemm import FOLD_METHODS
from ..native.linear import mx_method
from ..native.tuning import default_tuning
from .checkpoint import load_checkpoint, save_checkpoint
from .config import TRAIN_PRESETS, RunExists, TrainConfig, TrainingDiverged, lr_at
from .data import load_tokenizer, open_stream, validation_set
from .distributed import Dist, setup_dist
from .metrics import Metrics, read_metrics
from .model import Llama, flops_per_token
from .plotting import plot
from .profiling import StepProfiler, peak_flops, peak_memory


def build(cfg: TrainConfig, dist: Dist):
    """(model, optimizer, tokenizer, model config): the configuration validated, the model
    built, converted to the recipe, sharded (world > 1) and initialized on the device."""
    mcfg = cfg.validate()
    data, opt_cfg, precision = cfg.data, cfg.optimizer, cfg.precision
    tok = load_tokenizer(data.tokenizer or Path(data.data) / "tokenizer.json")
    if tok.get_vocab_size() > mcfg.vocab_size:
        mcfg = replace(mcfg, vocab_size=tok.get_vocab_size())
    torch.manual_seed(cfg.training.seed)
    # built on the meta device, sharded, then materialized: an 8B model never exists in full on
    # one device (fp32 weights alone are 32 GB)
    with torch.device("meta"):
        model = Llama(mcfg)
    model.activation_checkpointing = cfg.training.activation_checkpointing
    convert_linears(model, precision.recipe, rules=[(p, None) for p in precision.keep_bf16],
                    seed=cfg.training.seed, backend=precision.backend,
                    method=precision.gemm_method, accumulation=precision.accumulation)
    if dist.world > 1:  # FSDP2: each block, then the root; fp32 shards, bf16 compute by autocast
        from torch.distributed.fsdp import fully_shard
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    model.to_empty(device=dist.device)
    # the initial weights are drawn on the device (CPU or the GPU), the same for any world size
    model.init_weights(opt_cfg.init_std,
                       torch.Generator(dist.device).manual_seed(cfg.training.seed))
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": opt_cfg.weight_decay},
                             {"params": other, "weight_decay": 0.0}],
                            lr=opt_cfg.lr, betas=opt_cfg.betas, eps=opt_cfg.eps,
                            fused=dist.device.type == "cuda")  # one kernel for the update
    return model, opt, tok, mcfg


def gemm_method_run(model, device, tokens: int) -> str | None:
    """The methods the MX GEMMs of ``model`` run on micro-batches of ``tokens`` tokens on
    ``device``, each GEMM's as ``native.linear.mx_method`` resolves it ('auto' by the GEMM's
    size: on Hopper ``native.gemm.HOPPER_AUTO_LARGE`` for a layer of tokens x in x out from
    ``HOPPER_AUTO_LARGE_MNK`` up, ``HOPPER_AUTO`` below, 'bf16' where a cuBLAS method refuses
    the shape), joined by ' + ' where layers differ (``methods_of`` splits them); a chip's
    accumulation model, or the emulator backend, named as such; None without an MX GEMM."""
    found = set()
    for m in model.modules():
        if not isinstance(m, MXLinear):
            continue
        ctx, i, o = m.context, m.in_features, m.out_features
        for gemm, (rows, cols, k) in zip(GEMMS, ((tokens, o, i), (tokens, i, o), (o, i, tokens))):
            g = m.recipe.gemm(gemm)
            if not g.is_mx:
                continue
            found.add(f"accumulation {ctx.accumulation}" if ctx.accumulation is not None
                      else mx_method(g, device, rows, cols, k, ctx))
    return " + ".join(sorted(found)) or None


def methods_of(method_run: str | None) -> set[str]:
    """The methods of ``gemm_method_run``'s answer."""
    return set(method_run.split(" + ")) if method_run else set()


def linear_both_axes_run(method_run: str | None, device) -> bool | None:
    """Whether a model whose MX GEMMs run ``method_run`` (``gemm_method_run``) may
    quantize-dequantize X and ∇Y along both axes in one pass (``Tuning.linear_both_axes`` of
    ``device``'s tuning, for the layers of GEMM method 'bf16' on the Triton kernels; a layer
    takes it where its recipe gives both GEMMs the same RNE numerics): the same bits either
    way, other speed. None without an MX GEMM."""
    if method_run is None:
        return None
    return "bf16" in methods_of(method_run) and default_tuning(device).linear_both_axes


def tuning_run(method_run: str | None, device) -> dict | None:
    """The tiles and paths the native kernels take on ``device`` (``default_tuning``, the
    environment's overrides included) for a model with MX GEMMs (``method_run`` not None), as
    config.json records them: which kernels a run timed. None without an MX GEMM."""
    if method_run is None:
        return None
    return asdict(default_tuning(device))


def loss_fn(model, batch, device):
    batch = batch.to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logits = model(batch[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


@contextmanager
def bf16_forward(model):
    """For the duration: every MXLinear of ``model`` computes with recipe 'bf16' (exactly
    nn.Linear's bf16 computation, no quantization) from the same master weights; the recipes are
    restored after. Swaps module attributes only, so it works under FSDP2 (DTensor parameters)
    and leaves a compiled twin's graph valid (its guards see the restored recipe objects)."""
    mods = [m for m in model.modules() if isinstance(m, MXLinear)]
    saved = [(m.recipe, m.keyed) for m in mods]
    try:
        for m in mods:
            m.recipe, m.keyed = RECIPES["bf16"], False  # keyed False: the key buffer stays as is
        yield model
    finally:
        for m, (recipe, keyed) in zip(mods, saved):
            m.recipe, m.keyed = recipe, keyed


def quantizes(model) -> bool:
    """Whether any Linear of ``model`` computes other than in bf16."""
    return any(isinstance(m, MXLinear) and any(m.recipe.gemm(g).precision != "bf16"
                                               for g in GEMMS)
               for m in model.modules())


@torch.no_grad()
def evaluate(model, val, dist: Dist, batch_size: int) -> float:
    """Mean validation loss through the model as it is (its recipe's forward); under FSDP every
    rank takes a slice of the set."""
    model.eval()
    mine = val[dist.rank::dist.world]
    total = 0.0
    try:
        for i in range(0, len(mine), batch_size):
            chunk = mine[i:i + batch_size]
            total += float(loss_fn(model, chunk, dist.device)) * len(chunk)
    finally:
        model.train()
    return dist.mean(total) * dist.world / len(val)


def evaluate_both(model, val, dist: Dist, batch_size: int) -> dict[str, float]:
    """{'val_loss': the master weights through a bf16 forward with no quantization (the measure
    of what training did to the weights), 'val_loss_recipe': the training recipe's own forward}.
    Equal (one evaluation) when the model computes in bf16. Runs on the eager model."""
    with bf16_forward(model):
        plain = evaluate(model, val, dist, batch_size)
    own = evaluate(model, val, dist, batch_size) if quantizes(model) else plain
    return {"val_loss": plain, "val_loss_recipe": own}


def forward_backward(model, step_model, stream, step: int, cfg: TrainConfig,
                     dist: Dist) -> tuple[float, float]:
    """Gradients of one step's micro-batches, clipped; (mean loss over ranks, gradient norm).
    Every rank reads the same stream and takes its slice of each global batch."""
    b, accum = cfg.data.batch_size, cfg.data.grad_accum
    graphs = cfg.training.compile and cfg.training.compile_mode == "reduce-overhead"
    # summed on the device, in float64 as Python summed it before: no sync per micro-batch
    loss_sum = torch.zeros((), dtype=torch.float64, device=dist.device)
    for micro in range(accum):
        set_step(model, step, micro)
        batch = stream.next_batch(b * dist.world)[dist.rank * b:(dist.rank + 1) * b]
        if graphs and micro == 0:
            # the last step's outputs are dead now (its gradients were set to None): the
            # replays may reuse their memory. Not between micro-batches: the gradients the
            # first one left in .grad are alive, and the next replay must not overwrite them
            torch.compiler.cudagraph_mark_step_begin()
        loss = loss_fn(step_model, batch, dist.device)
        (loss / accum).backward()
        loss_sum += loss.detach()
    loss_sum = float(loss_sum)
    grad_norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), cfg.optimizer.clip)
    if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
        grad_norm = grad_norm.full_tensor()
    return dist.mean(loss_sum / accum), float(grad_norm)


def non_finite(step: int, loss: float, grad_norm: float) -> str | None:
    """The message for a step whose loss or gradient norm is NaN or infinite, else None."""
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return None
    what = "loss" if not math.isfinite(loss) else "gradient norm"
    return f"step {step}: non-finite {what} (loss {loss}, grad_norm {grad_norm})"


log = logging.getLogger(__name__.rsplit(".", 1)[0])  # ocpmx.llama_train

# what a run writes into OUT (besides files a user put there): --overwrite removes these
RUN_OUTPUTS = ("metrics.jsonl", "checkpoints", "tb", "config.json", "step_breakdown.json",
               "memory.json")


def prepare_run_dir(out: Path, resume: bool, overwrite: bool, dist: Dist) -> None:
    """Before anything is built or written: refuse to start afresh in a directory holding a
    run (metrics.jsonl or checkpoints/) unless ``overwrite``, which removes that run's outputs
    (RUN_OUTPUTS); then make sure OUT can be created and written. Raises RunExists (a
    FileExistsError), PermissionError or NotADirectoryError with a one-line message."""
    if resume and overwrite:
        raise ValueError("--resume continues the run in OUT and --overwrite replaces it: "
                         "give one of them")
    held = [n for n in ("metrics.jsonl", "checkpoints") if (out / n).exists()]
    if held and not resume and not overwrite:
        raise RunExists(f"{out} holds a run ({', '.join(held)}): continue it with --resume or "
                        "replace it with --overwrite")
    dist.barrier()  # every rank has looked before rank 0 removes anything
    if dist.main:
        if held and overwrite:
            for name in RUN_OUTPUTS:
                p = out / name
                if p.is_dir():
                    shutil.rmtree(p)
                elif p.exists():
                    p.unlink()
            log.info(f"--overwrite: removed the previous run's outputs in {out}")
        try:
            out.mkdir(parents=True, exist_ok=True)
            probe = out / f".write_test_{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except (FileExistsError, NotADirectoryError):
            raise NotADirectoryError(f"cannot use --out {out}: a file is in the way") from None
        except PermissionError:
            raise PermissionError(f"cannot write to --out {out}: permission denied") from None
    dist.barrier()


@contextmanager
def deterministic_mode(on: bool):
    """``--deterministic``: within the block, torch's deterministic algorithms (an op without
    a deterministic kernel raises), cuBLAS's fixed workspace (``CUBLAS_WORKSPACE_CONFIG``, read
    when the process first uses cuBLAS: set here unless already set) and Inductor's
    deterministic mode (it benchmarks some kernels' configurations on the device and keeps the
    fastest, which can change the bits with the load on a shared GPU). Restored afterwards,
    except ``CUBLAS_WORKSPACE_CONFIG``, which stays set. Two trainings of one seed without it
    differed from their first backward on the H100 (results/ablation_v2/README.md, "Two
    trainings of one seed"); with it, two 40-step trainings of one seed (bf16, mxfp4_wgrad)
    were bit-identical on an H200 (results/determinism_h200/).

    Not covered: the order in which a CPU's threads combine partial results. Compiled CPU
    trainings with two threads each, four at once on two cores, differed in one pair of two in
    each of two tries (either pair, with or without this mode); with one thread
    (OMP_NUM_THREADS=1) all four agreed in three tries. So on a CPU with more than one thread
    this warns and leaves the thread count as it is."""
    if not on:
        yield
        return
    if not torch.cuda.is_available() and torch.get_num_threads() > 1:
        log.warning(f"--deterministic on a CPU with {torch.get_num_threads()} threads: threads "
                    "may combine partial results in a different order from run to run (seen "
                    "with compiled runs sharing the cores); OMP_NUM_THREADS=1 for the same bits")
    import torch._inductor.config as inductor_config
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(), inductor_config.deterministic)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    inductor_config.deterministic = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        inductor_config.deterministic = before[2]


def check_resumed_model(out: Path, mcfg) -> None:
    """On ``--resume``: the model this run builds must be the one OUT's run trained
    (config.json's ``model``, the fields both name): a checkpoint of another size would fail
    deep in loading with missing keys. A ValueError names the fields that differ."""
    path = out / "config.json"
    was = json.loads(path.read_text()).get("model") if path.is_file() else None
    if not was:
        return
    now = json.loads(json.dumps(asdict(mcfg)))
    diff = [f"{k} {was[k]} -> {now[k]}" for k in sorted(set(was) & set(now)) if was[k] != now[k]]
    if diff:
        raise ValueError(f"--resume: {out} holds a run of another model ({', '.join(diff)}): "
                         "give that run's --preset and --layers, or another --out")


def train(cfg: TrainConfig, resume: bool = False, overwrite: bool = False) -> dict:
    """Train as ``cfg`` says into OUT (cfg.logging.out). ``resume``: continue from
    OUT/checkpoints/latest; ``overwrite``: replace a run already in OUT (without either, a run
    there is an error: RunExists)."""
    with deterministic_mode(cfg.training.deterministic):
        return _train(cfg, resume, overwrite)


def _train(cfg: TrainConfig, resume: bool, overwrite: bool) -> dict:
    dist = setup_dist(cfg.training.device)
    device, out = dist.device, Path(cfg.logging.out)
    steps, seq_len = cfg.training.max_steps, cfg.data.seq_len
    cfg.validate()
    if not Path(cfg.data.data).is_dir():
        raise FileNotFoundError(f"data directory {cfg.data.data} does not exist")
    prepare_run_dir(out, resume, overwrite, dist)
    if cfg.training.compile_mode == "reduce-overhead" and dist.world > 1:
        # FSDP2 frees and re-gathers the unsharded parameters around every forward and backward:
        # their addresses move, and a CUDA graph replays fixed addresses (not tested: refused)
        raise ValueError(f"--compile-mode reduce-overhead runs one process; this run has "
                         f"{dist.world} (FSDP2)")
    model, opt, tok, mcfg = build(cfg, dist)
    if resume:
        check_resumed_model(out, mcfg)
    state = load_checkpoint(out, model, opt, dist) if resume else None
    if resume and state is None and dist.main:
        log.warning(f"no checkpoint in {out}/checkpoints: starting from step 0")
    start, tokens, skipped = 0, 0, 0
    if state:
        start, tokens, skipped = state["step"] + 1, state["tokens"], state["skipped"]
    stream = open_stream(cfg.data.data, tok, seq_len, cfg.training.seed,
                         state["data"] if state else None, cfg.data.data_order)
    val = validation_set(cfg.data.data, tok, seq_len, cfg.eval.eval_sequences,
                         cfg.eval.eval_sampling)
    method_run = gemm_method_run(model, device, cfg.data.batch_size * seq_len)
    folds = bool(methods_of(method_run) & set(FOLD_METHODS))  # (some layers may run 'bf16')
    if folds:
        # the running count of rounded fold elements, from 0 for this run; created here, before
        # any compiled step: made lazily inside a CUDA graph's warm-up it would be a tensor of
        # the graph's memory pool that no graph output tracks (torch.compile's reduce-overhead
        # refuses to record)
        fold.reset_inexact_total(device)
    if dist.main:
        facts = {"model": asdict(mcfg), "world": dist.world,  # config.RUN_FACTS
                 "gemm_method_run": method_run,
                 "linear_both_axes_run": linear_both_axes_run(method_run, device),
                 "tuning_run": tuning_run(method_run, device)}
        (out / "config.json").write_text(json.dumps({**cfg.to_flat(), **facts}, indent=1))
    metrics = Metrics(out, enabled=dist.main, resume_step=state["step"] if state else None,
                      tensorboard=cfg.logging.tensorboard, steps=(start, steps),
                      label=f"{cfg.model.preset}/{cfg.precision.recipe}",
                      progress=cfg.logging.progress, log_every=cfg.logging.log_every)
    profiler = StepProfiler(cfg.logging.profile_step if dist.main else None, device, out)
    mode = cfg.training.compile_mode
    step_model = (torch.compile(model, mode=None if mode == "default" else mode)
                  if cfg.training.compile else model)
    fpt, peak = flops_per_token(mcfg, seq_len), peak_flops(device) * dist.world
    step_tokens = cfg.data.batch_size * cfg.data.grad_accum * seq_len * dist.world
    target = cfg.eval.target_loss
    result = {"tokens_to_target": None}
    with metrics, profiler:
        for step in range(start, steps):
            profiler.step_begins(step)
            t0 = time.perf_counter()
            lr = lr_at(step, cfg)
            for g in opt.param_groups:
                g["lr"] = lr
            loss, grad_norm = forward_backward(model, step_model, stream, step, cfg, dist)
            problem = non_finite(step, loss, grad_norm)
            if problem is None:
                opt.step()
            opt.zero_grad(set_to_none=True)
            if problem and cfg.training.nan_policy == "stop":
                raise TrainingDiverged(f"{problem}; the last good checkpoint is kept in "
                                       f"{out}/checkpoints")
            if problem:
                skipped += 1
                if dist.main:
                    log.warning(f"{problem}; step skipped ({skipped} so far)")
            tokens += step_tokens
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            dt = time.perf_counter() - t0
            row = {"step": step, "tokens": tokens, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                   "tokens_per_s": step_tokens / dt, "mfu": step_tokens * fpt / dt / peak,
                   "skipped": skipped}
            if step == start and start > 0:
                row["resumed"] = True  # the first step of a resumed process: not a step's time
            if device.type == "cuda":
                row["max_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
            if folds:  # never silent: rounded fold elements
                row["fold_inexact"] = int(fold.inexact_total(device).item())
            profiler.step_ends(step)
            metrics.log_step(row)
            last, reached = step == steps - 1, False
            if (step + 1) % cfg.eval.eval_every == 0 or last:
                # both through the eager model: a compiled twin's graph stays as it is
                losses = evaluate_both(model, val, dist, cfg.data.batch_size)
                metrics.log_eval(step, tokens, **losses)
                reached = target is not None and losses["val_loss"] <= target
                if reached:
                    result["tokens_to_target"] = tokens
            every, keep_steps = cfg.checkpoint.save_every, cfg.checkpoint.keep_steps
            saving = (every and ((step + 1) % every == 0 or last or reached)) or step in keep_steps
            metrics.flush(sync=saving)  # a checkpoint's rows are on disk before it
            if saving:
                save_checkpoint(out, step, model, opt, stream, tokens, skipped,
                                cfg.checkpoint.keep, dist, cfg.checkpoint.checkpoint_format,
                                keep_steps)
            if reached:
                break
    result.update(tokens=tokens, skipped=skipped, world=dist.world)
    if device.type == "cuda":
        result["peak_memory_gb"] = peak_memory(dist)
        if dist.main:
            (out / "memory.json").write_text(json.dumps(result["peak_memory_gb"], indent=1))
    dist.close()  # every rank got here: the process group ends together
    return result


__all__ = ["RECIPES", "RunExists", "TrainConfig", "TrainingDiverged", "TRAIN_PRESETS", "lr_at",
           "plot", "read_metrics", "train"]

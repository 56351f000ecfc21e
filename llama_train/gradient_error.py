"""Test the study's explanation, not only its outcome: for fixed weights and a fixed sequence of
batches, how large is each arm's Wgrad error, and how does it correlate from one step to the
next?

The claim under test: MXFP4's micro-scaling error in Wgrad is *structured*: the same inputs give
the same error, and consecutive batches give errors that point the same way, so the error
accumulates in the weights (through momentum and over steps) instead of averaging out;
random signs or stochastic rounding change the pattern each step.

Method. A model (a checkpoint of the bf16 run) runs forward and backward in bf16 on batches
t = 0..K-1; hooks take every MXLinear's input X and output gradient dY (the same dY for every
treatment: this isolates the Wgrad GEMM's own error from the errors upstream of it). For each
distinct Wgrad treatment among the ablation's arms, G_q(t) = recipe_gemm('wgrad', ...) on the
GEMM's real operands (quantized along tokens, the keys of the random bits as in training at
step t), G(t) = dYᵀX in float64, E(t) = G_q(t) - G(t), over all layers as one vector:

* relative_error       ||E(t)|| / ||G(t)||, the mean over t
* cos_consecutive      cos(E(t), E(t+1)): does the error keep its direction across batches?
* cos_same_batch       cos(E(0) at step 0, E(0) at step K): the same batch at another step;
                       1 for deterministic treatments, < 1 where random bits change per step
* cos_error_gradient   cos(E(t), G(t)): the error's alignment with the gradient (a bias)
* accumulation         ||sum_t E(t)|| / sqrt(sum_t ||E(t)||^2): 1 for independent errors,
                       sqrt(K) for identical ones; ``gradient_accumulation`` is the same for G
                       (how consistent the true gradient itself is over the K batches)

and, per GEMM and operand, the fraction of saturated elements (|x| above the element format's
largest normal times the block scale, after the rotation) and of zero-flushed ones (nonzero
inputs that quantize to 0), for MXFP4 with and without the H16 rotation.

The reference rotation for these statistics is a float64 matrix product, not the kernel's float32
butterfly; the two differ in the last bits, so an element exactly at a threshold may count on the
other side (a negligible effect on fractions).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from ..native import GEMMS, RECIPES, GemmContext, MXLinear, dequantize, quantize, recipe_gemm
from ..native.recipes import MX_SCALE_RULE, OPERANDS, GemmRecipe
from .ablation import ARMS


def wgrad_treatments(arms=ARMS) -> dict[str, tuple[GemmRecipe, list[str]]]:
    """{name: (Wgrad recipe, arms using it)}, named after the first arm using it."""
    out: dict[str, tuple[GemmRecipe, list[str]]] = {}
    for arm in arms:
        g = RECIPES[arm].wgrad
        for name, (g2, users) in out.items():
            if g2 == g:
                users.append(arm)
                break
        else:
            out[arm] = (g, [arm])
    return out


def capture_with_grads(model, batch: torch.Tensor, device, micro: int | None = None):
    """(loss, [(layer, X, dY)]) for every MXLinear of ``model`` on one batch (bf16 forward and
    backward); the parameters keep their gradients (the true ones). ``micro``: forward and
    backward in micro-batches of that many sequences (as training accumulates them; the
    activations of one micro-batch at a time), each loss weighted by its share of the batch,
    so the gradients, X and dY are the whole batch's (dY as the whole batch's mean loss gives
    it); the loss is the batch's mean."""
    from .train import loss_fn
    n = batch.shape[0]
    if micro is not None and micro < 1:
        raise ValueError(f"micro-batches of {micro} sequences: must be at least 1")
    micro = min(micro or n, n)
    if n % micro:
        raise ValueError(f"the batch's {n} sequences do not divide into micro-batches of {micro}")
    seen: dict[MXLinear, list] = {}
    hooks = []
    for mod in model.modules():
        if isinstance(mod, MXLinear):
            seen[mod] = [[], []]
            hooks.append(mod.register_forward_hook(
                lambda m, i, o: seen[m][0].append(i[0].detach().reshape(-1, i[0].shape[-1]))))
            hooks.append(mod.register_full_backward_hook(
                lambda m, gi, go: seen[m][1].append(go[0].detach().reshape(-1, go[0].shape[-1]))))
    total = 0.0
    try:
        model.zero_grad(set_to_none=True)
        for c in range(0, n, micro):
            loss = loss_fn(model, batch[c:c + micro], device) * (micro / n)
            loss.backward()
            total += float(loss.detach())
    finally:
        for h in hooks:
            h.remove()
    if micro == n:
        return total, [(m, x[0], dy[0]) for m, (x, dy) in seen.items()]
    # one layer at a time, each micro-batch's pieces freed once no layer holds them; layers fed
    # the same input (wq, wk, wv; w1, w3) share one concatenated X, as they share one tensor in
    # the whole-batch capture
    out, shared = [], {}
    for m in list(seen):
        xs, dys = seen.pop(m)
        key = tuple((t.data_ptr(), tuple(t.shape)) for t in xs)
        if key not in shared:
            shared[key] = torch.cat(xs)
        del xs
        out.append((m, shared[key], torch.cat(dys)))
        del dys
    return total, out


def capture(model, batch: torch.Tensor, device) -> list[tuple[MXLinear, torch.Tensor, torch.Tensor]]:
    """(layer, X, dY) for every MXLinear of ``model`` on one batch (bf16 forward and backward);
    the gradients are dropped."""
    _, layers = capture_with_grads(model, batch, device)
    model.zero_grad(set_to_none=True)
    return layers


def _ctx(layer, step, seed=0) -> GemmContext:
    return GemmContext(seed=seed, layer=layer.layer_id, step=step, micro=0,
                       backend=layer.context.backend)


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.dot(a, b) / (a.norm() * b.norm()))


def wgrad_error(layers_per_batch, treatments, repeat_step: int) -> dict:
    """The statistics above for each treatment; ``layers_per_batch[t]`` is capture()'s list."""
    K = len(layers_per_batch)
    # the float64 reference of each batch, all layers as one vector: the same for every treatment
    refs = [torch.cat([(dy.double().t() @ x.double()).flatten() for _, x, dy in layers])
            for layers in layers_per_batch]
    sum_g = torch.stack(refs).sum(0)
    g2_total = sum(float(r.norm()) ** 2 for r in refs)

    def error(g, t, step):
        gq = torch.cat([recipe_gemm("wgrad", g, dy, 0, x, 0, torch.float32,
                                    _ctx(layer, step)).double().flatten()
                        for layer, x, dy in layers_per_batch[t]])
        return gq - refs[t]

    res = {}
    for name, (g, users) in treatments.items():
        errs = [error(g, t, t) for t in range(K)]
        e_again = error(g, 0, repeat_step)  # the first batch at another step: its random bits
        sum_e = torch.stack(errs).sum(0)
        res[name] = {
            "arms": users, "precision": g.precision, "rotation": g.rotation, "rounding": list(g.rounding),
            "relative_error": float(np.mean([float(e.norm() / r.norm())
                                             for e, r in zip(errs, refs)])),
            "cos_consecutive": float(np.mean([_cos(a, b) for a, b in zip(errs[1:], errs)]))
            if K > 1 else None,
            "cos_same_batch": _cos(errs[0], e_again),
            "cos_error_gradient": float(np.mean([_cos(e, r) for e, r in zip(errs, refs)])),
            "accumulation": float(sum_e.norm()) / math.sqrt(sum(float(e.norm()) ** 2
                                                                  for e in errs)),
            "gradient_accumulation": float(sum_g.norm()) / math.sqrt(g2_total),
            "batches": K,
        }
    return res


def _rotate(x: torch.Tensor, rot, axis: int) -> torch.Tensor:
    if rot is None:
        return x.double()
    r = torch.from_numpy(rot.matrix()).to(x.device)
    m = x.double().movedim(axis, -1)
    y = (m.reshape(*m.shape[:-1], -1, r.shape[0]) @ r.t()).reshape(m.shape)
    return y.movedim(-1, axis)


def saturation(layers, rotations=("none", "hadamard16")) -> dict:
    """Fractions of saturated and zero-flushed elements for every GEMM's MXFP4 operands."""
    out = {}
    for rot_name in rotations:
        g = GemmRecipe("mxfp4", rotation=rot_name, scale_rule=MX_SCALE_RULE)
        counts = {}
        for layer, x, dy in layers:
            w = layer.weight.detach()
            ops = {"fprop": ((x, 1), (w, 1)), "dgrad": ((dy, 1), (w, 0)),
                   "wgrad": ((dy, 0), (x, 0))}
            for gemm in GEMMS:
                rot = _ctx(layer, 0).rotation(g, gemm)
                for name, (t, axis) in zip(OPERANDS[gemm], ops[gemm]):
                    q = quantize(t, "e2m1", axis=axis, scale_rule=g.scale_rule, rotation=rot,
                                 backend=layer.context.backend)
                    deq = dequantize(q, backend=layer.context.backend).double()
                    xr = _rotate(t, rot, axis)
                    scale = torch.pow(2.0, q.scales.double() - 127).repeat_interleave(32, dim=axis)
                    sat = (xr.abs() > q.fmt.max_normal * scale).sum()
                    flushed = ((xr != 0) & (deq == 0)).sum()
                    c = counts.setdefault(f"{gemm}.{name}", [0, 0, 0])
                    c[0] += int(sat)
                    c[1] += int(flushed)
                    c[2] += t.numel()
        out[rot_name] = {k: {"saturated": s / n, "zero_flushed": f / n}
                         for k, (s, f, n) in counts.items()}
    return out


def load_run(run, data: str | None = None):
    """(model, tokenizer, config, process group, checkpoint state) of a run directory's latest
    checkpoint, every Linear in bf16 (the analysis quantizes itself)."""
    from .checkpoint import load_checkpoint
    from .config import RUN_FACTS, TrainConfig
    from .distributed import setup_dist
    from .train import build
    run = Path(run)
    conf = {k: v for k, v in json.loads((run / "config.json").read_text()).items()
            if k not in RUN_FACTS}  # flat names; older runs' too (mx_backend)
    cfg = TrainConfig.from_flat(**{**conf, "data": data or conf["data"], "recipe": "bf16",
                                   "compile": False, "compile_mode": "default",
                                   "activation_checkpointing": False,
                                   "progress": False, "tensorboard": False})
    dist = setup_dist(cfg.training.device)
    model, opt, tok, _ = build(cfg, dist)
    state = load_checkpoint(run, model, opt, dist)
    if state is None:
        raise FileNotFoundError(f"no checkpoint in {run}/checkpoints")
    return model, tok, cfg, dist, state


def analyze(run: str, out: str, batches: int = 8, batch_size: int = 16, data: str | None = None,
            arms=ARMS) -> dict:
    """Load ``run``'s latest checkpoint (a bf16 run), take ``batches`` consecutive training
    batches of ``batch_size`` sequences (the stream of seed 1000: not the ones it trained on
    last), and write OUT/gradient_error.json and .md."""
    from .data import TokenStream
    model, tok, cfg, dist, state = load_run(run, data)
    stream = TokenStream(cfg.data.data, tok, cfg.data.seq_len, seed=1000)
    captured = [capture(model, stream.next_batch(batch_size), dist.device)
                for _ in range(batches)]
    result = {"run": str(run), "checkpoint_step": state["step"], "batches": batches,
              "tokens_per_batch": batch_size * cfg.data.seq_len,
              "device": torch.cuda.get_device_name() if dist.device.type == "cuda" else "cpu",
              "wgrad": wgrad_error(captured, wgrad_treatments(arms), repeat_step=batches + 1000),
              "saturation": saturation(captured[0])}
    o = Path(out)
    o.mkdir(parents=True, exist_ok=True)
    (o / "gradient_error.json").write_text(json.dumps(result, indent=1))
    (o / "gradient_error.md").write_text(markdown(result))
    return result


def markdown(r: dict) -> str:
    lines = [f"Checkpoint: `{r['run']}` step {r['checkpoint_step']}; {r['batches']} consecutive "
             f"batches of {r['tokens_per_batch']:,} tokens; {r['device']}.", "",
             "| Wgrad treatment (arms) | rel. error | cos(E_t, E_t+1) | cos same batch, other step "
             "| cos(E, G) | accumulation of E (1 = independent, "
             f"{math.sqrt(r['batches']):.2f} = identical) |", "|---|---|---|---|---|---|"]
    ga = None
    for name, w in r["wgrad"].items():
        ga = w["gradient_accumulation"]
        what = f"{w['precision']}, {w['rotation']}, {'/'.join(w['rounding'])}"
        lines.append(f"| {what} ({', '.join(w['arms'])}) | {w['relative_error']:.4f} | "
                     f"{w['cos_consecutive']:+.3f} | {w['cos_same_batch']:+.3f} | "
                     f"{w['cos_error_gradient']:+.4f} | {w['accumulation']:.3f} |")
    lines += ["", f"The true gradient's own accumulation over these batches: {ga:.3f}.", "",
              "| operand | saturated (no rotation) | zero-flushed (no rotation) | saturated (H16) "
              "| zero-flushed (H16) |", "|---|---|---|---|---|"]
    s = r["saturation"]
    for k in s["none"]:
        a, b = s["none"][k], s.get("hadamard16", {}).get(k, {})
        lines.append(f"| {k} | {a['saturated']:.2e} | {a['zero_flushed']:.2e} | "
                     f"{b.get('saturated', float('nan')):.2e} | {b.get('zero_flushed', float('nan')):.2e} |")
    return "\n".join(lines) + "\n"

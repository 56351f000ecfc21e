"""The Wgrad mechanism analysis, redone for plan v2 (issue 16; results/ablation_v2/PLAN.md).

The study's explanation: MXFP4's Wgrad error is *structured*, it keeps its direction from one
batch to the next, so it accumulates in the weights (through Adam's moments and over steps)
instead of averaging out; a fixed H16 breaks the structure. ``gradient_error`` (v1) measured it
on one checkpoint, 8 batches, without intervals, on the raw gradient, keeping the error's
component along the true gradient (which is a shrinkage of the gradient, not a drift). Here:

* checkpoints: the bf16 seed-0 run's at 25%, 50% and 100% of its budget (``keep_steps``);
* from each, ``batches`` (>= 128) consecutive training steps along the run's own trajectory:
  the batches the run would have seen next (its data stream from the checkpoint's position),
  the weights advanced by AdamW with the true gradients at the run's learning rate (so the
  errors are those of a training trajectory, not of frozen weights); ``advance=False`` freezes
  them;
* at every step and for every MXLinear: its input X and output gradient dY (bf16 forward and
  backward), the true Wgrad G = dYᵀX in float64, and for each treatment (no rotation, H16,
  random signs re-drawn every step, stochastic rounding of dY, and the same by AMD gfx950's
  conversion, the study's hardware's) the quantized Wgrad G_q, as
  ``recipe_gemm`` computes it in training (keys of step t), and its error E = G_q - G;
* E⊥: E with its component along G projected out, per layer (each layer's G) and for the whole
  model (the model's G): what is left is the error that can drift the weights sideways;

and per layer and for the whole model, per treatment:

* ``cos1``: cos(E⊥(t), E⊥(t-1)), the mean over t: does the error keep its direction?
* ``acc_w``: the accumulation over windows of W consecutive batches,
  ‖Σ E⊥‖ / sqrt(Σ ‖E⊥‖²) (1 independent, sqrt(W) identical), the mean over the non-overlapping
  windows; ``acc_all``: the same over all the batches (exact, from running sums); and G's own;
* ``rel_error`` ‖E‖/‖G‖ and ``cos_eg`` cos(E, G) (the shrinkage);
* the Adam update direction: shadow AdamW moments (the checkpoint's exp_avg / exp_avg_sq and
  step), one pair fed with the true gradients G and one pair per treatment fed with G_q (both
  clipped with the true gradient's clipping factor, as training would); the update direction
  u = m̂ / (sqrt(v̂) + eps) of each against the true one: ``adam_rel`` ‖u_q - u‖/‖u‖,
  ``adam_perp`` the same with the component along u removed, ``adam_cos`` cos(u_q, u); the mean
  over the second half of the steps (the moments have mixed by then) and the last step's;
* the zero-flushed and saturated fractions of each GEMM operand: the Wgrad operands under each
  treatment (its rotation and rounding), the Fprop and Dgrad operands under MXFP4 with no
  rotation and with H16, every ``fractions_every`` steps;

with 95% intervals from a moving-block bootstrap over steps (blocks of ``block`` steps; over
windows for acc_w; over the sampled steps for the fractions).

Lagged inner products are kept for lags up to ``max_lag`` (a ring buffer of the last E's and
G's per layer), so both the per-layer and the whole-model projections come out exactly:
<E⊥_t, E⊥_s> = <E_t,E_s> - a_s<E_t,G_s> - a_t<G_t,E_s> + a_t a_s<G_t,G_s>, a_t = <E_t,G_t>/‖G_t‖².

``analyze_run`` runs it on a run's kept checkpoints and writes OUT/mechanism.json and .md. It
runs on CPU for the tiny model (tests) and on one GPU for the 30m checkpoints.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ..native import GemmContext, MXLinear, dequantize, quantize, recipe_gemm
from ..native.recipes import MX_SCALE_RULE, OPERANDS, GemmRecipe
from .gradient_error import capture_with_grads, load_run

_MX4 = GemmRecipe("mxfp4", scale_rule=MX_SCALE_RULE)
TREATMENTS = {
    "none": _MX4,
    "h16": replace(_MX4, rotation="hadamard16"),
    "random_sign": replace(_MX4, rotation="random_sign"),
    "sr": replace(_MX4, rounding=("stochastic", "rne")),
    # the study's hardware's stochastic rounding (AMD gfx950's conversion, emulator.gfx950):
    # added 2026-11-25 before any mechanism run (PLAN.md, deviations)
    "sr_gfx950": replace(_MX4, rounding=("stochastic", "rne"), conversion="gfx950"),
}


def _ctx(layer: MXLinear, step: int, seed: int) -> GemmContext:
    return GemmContext(seed=seed, layer=layer.layer_id, step=step, micro=0,
                       backend=layer.context.backend)


def block_bootstrap(values, stat=np.mean, block: int = 8, n: int = 1000, seed: int = 0):
    """95% percentile interval of ``stat`` over a series, from a moving-block bootstrap (blocks
    of ``block`` consecutive values, which keeps the series' short-range dependence); None for
    fewer than two values."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    if len(x) < 2:
        return None
    b = max(1, min(block, len(x) // 2))
    starts = len(x) - b + 1
    rng = np.random.default_rng(seed)
    k = math.ceil(len(x) / b)
    stats = []
    for _ in range(n):
        idx = (rng.integers(0, starts, size=k)[:, None] + np.arange(b)[None, :]).ravel()[:len(x)]
        stats.append(stat(x[idx]))
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return [float(lo), float(hi)]


def _fractions(t: torch.Tensor, axis: int, g: GemmRecipe, rot, seed: int, j: int,
               backend: str | None = None, elements: int = 1 << 24):
    """(saturated, zero-flushed) element counts of one operand quantized along ``axis`` under
    ``g``'s rounding of operand j and rotation ``rot``."""
    q = quantize(t, "e2m1", axis=axis, scale_rule=g.scale_rule, rounding=g.rounding[j],
                 seed=seed, rotation=rot, backend=backend, conversion=g.conversion)
    # in chunks of rows (the quantize axis last): a float64 copy of a whole captured operand
    # beside a training run's memory ran the GPU out of memory (twelfth session)
    deq = dequantize(q, backend=backend).movedim(axis, -1)
    xs = t.movedim(axis, -1)
    ss = q.scales.movedim(axis, -1)
    deq, xs, ss = (a.reshape(-1, a.shape[-1]) for a in (deq, xs, ss))
    r = None if rot is None else torch.from_numpy(rot.matrix()).to(t.device)
    sat = zero = 0
    rows = max(1, elements // xs.shape[-1])
    for i in range(0, xs.shape[0], rows):
        x = xs[i:i + rows].double()
        if r is not None:
            x = (x.reshape(x.shape[0], -1, r.shape[0]) @ r.t()).reshape(x.shape)
        scale = torch.pow(2.0, ss[i:i + rows].double() - 127).repeat_interleave(32, dim=-1)
        sat += int((x.abs() > q.fmt.max_normal * scale).sum())
        zero += int(((x != 0) & (deq[i:i + rows] == 0)).sum())
    return sat, zero


class _Tracker:
    """The lagged inner products of E and G per layer for one checkpoint's K steps."""

    def __init__(self, names, n_layers: int, K: int, max_lag: int):
        self.L = max_lag
        shape = (n_layers, K, max_lag + 1)
        self.ee = {q: np.full(shape, np.nan) for q in names}
        self.eg = {q: np.full(shape, np.nan) for q in names}
        self.ge = {q: np.full(shape, np.nan) for q in names}
        self.gg = np.full(shape, np.nan)


def _scope_products(tr: _Tracker, q: str, layers) -> tuple[np.ndarray, ...]:
    """(ee, eg, ge, gg) summed over ``layers``: arrays [t, lag]."""
    return (tr.ee[q][layers].sum(0), tr.eg[q][layers].sum(0), tr.ge[q][layers].sum(0),
            tr.gg[layers].sum(0))


def _projected(ee, eg, ge, gg) -> np.ndarray:
    """<E⊥_t, E⊥_{t-k}> [t, k] from the raw lagged products (NaN where t-k < 0)."""
    K, L1 = ee.shape
    a = eg[:, 0] / gg[:, 0]  # a_t = <E_t,G_t>/‖G_t‖²
    p = np.full_like(ee, np.nan)
    for k in range(L1):
        t = np.arange(k, K)
        s = t - k
        p[t, k] = ee[t, k] - a[s] * eg[t, k] - a[t] * ge[t, k] + a[t] * a[s] * gg[t, k]
    return p


def _window_acc(p: np.ndarray, W: int) -> list[float]:
    """Accumulation factors of the non-overlapping windows of W consecutive steps, from the
    lagged products p[t, k] (k < W needed)."""
    K = p.shape[0]
    out = []
    for w0 in range(0, K - W + 1, W):
        num = 0.0
        den = 0.0
        for t in range(w0, w0 + W):
            den += p[t, 0]
            num += p[t, 0] + 2 * sum(p[t, k] for k in range(1, t - w0 + 1))
        out.append(math.sqrt(max(num, 0.0) / den) if den > 0 else float("nan"))
    return out


def _series_stats(p: np.ndarray, W: int, block: int, n_boot: int) -> dict:
    K = p.shape[0]
    cos1 = [p[t, 1] / math.sqrt(p[t, 0] * p[t - 1, 0]) for t in range(1, K)
            if p[t, 0] > 0 and p[t - 1, 0] > 0] if p.shape[1] > 1 else []
    acc = _window_acc(p, W) if K >= W else []
    return {"cos1": float(np.mean(cos1)) if cos1 else None,
            "cos1_ci95": block_bootstrap(cos1, block=block, n=n_boot),
            "acc_w": float(np.mean(acc)) if acc else None,
            "acc_w_ci95": block_bootstrap(acc, block=1, n=n_boot),
            "windows": len(acc)}


def analyze_checkpoint(model, opt, stream, cfg, dist, step0: int, batches: int = 128,
                       batch_size: int | None = None, treatments=None, max_lag: int = 16,
                       window: int = 16, advance: bool = True, fractions_every: int = 16,
                       block: int = 8, bootstrap: int = 1000, micro: int | None = None) -> dict:
    """The statistics above from one checkpoint (model and optimizer loaded, ``stream`` at the
    checkpoint's data position, ``step0`` the first step after it). ``micro``: sequences per
    forward and backward (default the run's micro-batch; the batch's gradients either way)."""
    from .config import lr_at
    treatments = treatments or TREATMENTS
    names = list(treatments)
    K = batches
    W = min(window, max_lag + 1, K)
    device = dist.device
    seed = cfg.training.seed
    b = batch_size or cfg.data.batch_size * cfg.data.grad_accum
    micro = micro or (cfg.data.batch_size if b % cfg.data.batch_size == 0 else b)  # the run's
    mx = [m for m in model.modules() if isinstance(m, MXLinear)]
    layer_names = {m: n for n, m in model.named_modules() if isinstance(m, MXLinear)}
    nL = len(mx)
    tr = _Tracker(names, nL, K, max_lag)
    ring = [[] for _ in range(nL)]  # per layer (E of each treatment, G) float32, newest last
    # running sums for the accumulation over all K steps, per layer
    sum_e = {q: [None] * nL for q in names}
    sum_ag_layer = {q: [None] * nL for q in names}
    sum_ag_model = {q: [None] * nL for q in names}
    sum_g = [None] * nL
    g2_total = np.zeros(nL)
    e2_total = {q: np.zeros(nL) for q in names}
    # shadow Adam moments from the checkpoint's state: one true pair, one pair per treatment
    beta1, beta2 = opt.param_groups[0]["betas"]
    eps = opt.param_groups[0]["eps"]
    st0 = [opt.state.get(m.weight, {}) for m in mx]
    adam_step0 = int(float(st0[0].get("step", 0))) if st0 and st0[0] else 0

    def moments(i):
        s = st0[i]
        m = s.get("exp_avg")
        v = s.get("exp_avg_sq")
        shape = mx[i].weight.shape
        m = torch.zeros(shape, dtype=torch.float64, device=device) if m is None else \
            m.detach().to(device, torch.float64).clone()
        v = torch.zeros(shape, dtype=torch.float64, device=device) if v is None else \
            v.detach().to(device, torch.float64).clone()
        return [m, v]
    true_mom = [moments(i) for i in range(nL)]
    shadow = {q: [moments(i) for i in range(nL)] for q in names}
    adam = {q: {"rel": np.full((nL, K), np.nan), "perp": np.full((nL, K), np.nan),
                "cos": np.full((nL, K), np.nan), "dd": np.zeros((nL, K)),
                "du": np.zeros((nL, K)), "uu": np.zeros((nL, K))} for q in names}
    fr_counts: dict = {}  # (treatment or context, operand) -> list of (sat, flushed, n) per sample
    rel_err = {q: np.zeros((nL, K)) for q in names}
    cos_eg = {q: np.zeros((nL, K)) for q in names}

    t_start = time.perf_counter()
    for t in range(K):
        if t and t % 8 == 0:  # progress on stderr: the analysis's run time per step
            print(f"step {step0 + t}: {t}/{K} in {time.perf_counter() - t_start:.0f} s",
                  file=sys.stderr, flush=True)
        step = step0 + t
        batch = stream.next_batch(b)
        # [(layer, X, dY)], grads kept; in micro-batches (one micro-batch's activations)
        _, layers = capture_with_grads(model, batch, device, micro)
        by = {m: (x, dy) for m, x, dy in layers}
        norm = float(torch.nn.utils.clip_grad_norm_(list(model.parameters()),
                                                    cfg.optimizer.clip))
        coef = min(1.0, cfg.optimizer.clip / (norm + 1e-6))
        G = []
        for i, m in enumerate(mx):
            x, dy = by[m]
            G.append(dy.double().t() @ x.double())
        E = {q: [] for q in names}
        for q, g in treatments.items():
            for i, m in enumerate(mx):
                x, dy = by[m]
                gq = recipe_gemm("wgrad", g, dy, 0, x, 0, torch.float32, _ctx(m, step, seed))
                E[q].append(gq.double() - G[i])
        # lagged products against the ring buffers (which hold steps t-1, t-2, ...): per layer
        # and lag one [nq + 1, nq + 1] float64 product of this step's (E of each treatment, G)
        # with that step's, lag 0 from the float64 vectors, older lags from the float32 ring;
        # the whole step's products reach the host in one transfer (one sync, not thousands)
        prods = []
        for i in range(nL):
            cur = torch.stack([E[q][i].flatten() for q in names] + [G[i].flatten()])
            ring[i].append(cur.float())
            if len(ring[i]) > max_lag + 1:
                ring[i].pop(0)
            past = (r.double() for r in ring[i][-2::-1])  # lag 1, 2, ...: one at a time
            prods.append(torch.stack([cur @ cur.t()] + [cur @ h.t() for h in past]))
            del cur
        pr = torch.stack(prods).cpu().numpy()  # [layer, lag, nq + 1, nq + 1]
        del prods
        lags = pr.shape[1]
        nq = len(names)
        tr.gg[:, t, :lags] = pr[:, :, nq, nq]
        g2_total += pr[:, 0, nq, nq]
        for j, q in enumerate(names):
            tr.ee[q][:, t, :lags] = pr[:, :, j, j]       # <E_t, E_t-k>
            tr.eg[q][:, t, :lags] = pr[:, :, j, nq]      # <E_t, G_t-k>
            tr.ge[q][:, t, :lags] = pr[:, :, nq, j]      # <G_t, E_t-k>
            e2_total[q] += pr[:, 0, j, j]
            rel_err[q][:, t] = np.sqrt(pr[:, 0, j, j] / pr[:, 0, nq, nq])
            cos_eg[q][:, t] = pr[:, 0, j, nq] / np.sqrt(pr[:, 0, j, j] * pr[:, 0, nq, nq])
        # running sums (per-layer and whole-model projection coefficients of step t)
        a_model = {q: sum(tr.eg[q][i, t, 0] for i in range(nL)) / sum(tr.gg[i, t, 0]
                                                                      for i in range(nL))
                   for q in names}
        for i in range(nL):
            sum_g[i] = G[i].clone() if sum_g[i] is None else sum_g[i] + G[i]
            for q in names:
                a_l = tr.eg[q][i, t, 0] / tr.gg[i, t, 0]
                for store, v in ((sum_e, E[q][i]), (sum_ag_layer, a_l * G[i]),
                                 (sum_ag_model, a_model[q] * G[i])):
                    store[q][i] = v.clone() if store[q][i] is None else store[q][i] + v
        # shadow Adam: moments fed with the clipped true and quantized gradients
        k_adam = adam_step0 + t + 1
        bc1, bc2 = 1 - beta1 ** k_adam, 1 - beta2 ** k_adam
        u_true = []
        for i in range(nL):
            m_, v_ = true_mom[i]
            g_ = coef * G[i]
            m_.mul_(beta1).add_(g_, alpha=1 - beta1)
            v_.mul_(beta2).addcmul_(g_, g_, value=1 - beta2)
            u_true.append((m_ / bc1) / ((v_ / bc2).sqrt() + eps))
        sums = []  # per treatment and layer: <d, d>, <d, u>, <u, u> (on the device)
        for q in names:
            for i in range(nL):
                m_, v_ = shadow[q][i]
                g_ = coef * (G[i] + E[q][i])
                m_.mul_(beta1).add_(g_, alpha=1 - beta1)
                v_.mul_(beta2).addcmul_(g_, g_, value=1 - beta2)
                u = (m_ / bc1) / ((v_ / bc2).sqrt() + eps)
                d = u - u_true[i]
                sums.append(torch.stack([(d * d).sum(), (d * u_true[i]).sum(),
                                         (u_true[i] * u_true[i]).sum()]))
        sums = torch.stack(sums).cpu().numpy().reshape(len(names), nL, 3)
        for j, q in enumerate(names):
            a = adam[q]
            a["dd"][:, t], a["du"][:, t], a["uu"][:, t] = sums[j].T
        # operand fractions on a subset of steps
        if t % fractions_every == 0:
            for i, m in enumerate(mx):
                x, dy = by[m]
                w = m.weight.detach()
                for q, g in treatments.items():
                    ctx = _ctx(m, step, seed)
                    rot = ctx.rotation(g, "wgrad")
                    for j, (name, tensor) in enumerate((("dy", dy), ("x", x))):
                        c = _fractions(tensor, 0, g, rot, ctx.rounding_seed("wgrad", j), j,
                                       ctx.backend)
                        _count(fr_counts, (q, f"wgrad.{name}"), t, c, tensor.numel())
                for rname, g in (("none", _MX4), ("h16", TREATMENTS["h16"])):
                    ctx = _ctx(m, step, seed)
                    for gemm, ops in (("fprop", ((x, 1), (w, 1))), ("dgrad", ((dy, 1), (w, 0)))):
                        rot = ctx.rotation(g, gemm)
                        for j, (name, (tensor, axis)) in enumerate(zip(OPERANDS[gemm], ops)):
                            c = _fractions(tensor, axis, g, rot, 0, j, ctx.backend)
                            _count(fr_counts, (rname, f"{gemm}.{name}"), t, c, tensor.numel())
        # advance the trajectory with the true (autograd) gradients
        if advance:
            lr = lr_at(step, cfg)
            for grp in opt.param_groups:
                grp["lr"] = lr
            opt.step()
        model.zero_grad(set_to_none=True)
        del layers, by, G, E

    # ---- statistics ----------------------------------------------------------------------------
    scopes = {"model": list(range(nL))}
    scopes.update({layer_names[m]: [i] for i, m in enumerate(mx)})
    half = K // 2
    out = {"steps": K, "first_step": step0, "window": W, "max_lag": max_lag,
           "batch_sequences": b, "advance": advance, "treatments": {}}
    g_acc = {}
    for sname, idx in scopes.items():
        sg = sum(float((sum_g[i] * sum_g[i]).sum()) for i in idx)
        g_acc[sname] = math.sqrt(sg / sum(g2_total[i] for i in idx))
    for q in names:
        res = {"recipe": {"rotation": treatments[q].rotation,
                          "rounding": list(treatments[q].rounding)}, "scopes": {}}
        for sname, idx in scopes.items():
            ee, eg, ge, gg = _scope_products(tr, q, idx)
            p = _projected(ee, eg, ge, gg)
            stats = _series_stats(p, W, block, bootstrap)
            # exact accumulation of E⊥ over all K steps from the running sums
            ag = sum_ag_model if sname == "model" else sum_ag_layer
            num = sum(float((sum_e[q][i] * sum_e[q][i]).sum())
                      - 2 * float((sum_e[q][i] * ag[q][i]).sum())
                      + float((ag[q][i] * ag[q][i]).sum()) for i in idx)
            den = float(np.nansum(p[:, 0]))
            raw = math.sqrt(sum(float((sum_e[q][i] * sum_e[q][i]).sum()) for i in idx)
                            / sum(e2_total[q][i] for i in idx))
            rel = np.sqrt(ee[:, 0] / gg[:, 0])
            ceg = eg[:, 0] / np.sqrt(ee[:, 0] * gg[:, 0])
            a = adam[q]
            dd, du, uu = (a[k][idx].sum(0) for k in ("dd", "du", "uu"))
            arel = np.sqrt(dd / uu)
            aperp = np.sqrt(np.maximum(dd - du ** 2 / uu, 0) / uu)
            acos = (uu + du) / np.sqrt(uu * (dd + 2 * du + uu))
            stats.update({
                "acc_all": math.sqrt(max(num, 0.0) / den) if den > 0 else None,
                "acc_all_raw": raw, "gradient_acc_all": g_acc[sname],
                "rel_error": float(rel.mean()), "rel_error_ci95": block_bootstrap(
                    rel, block=block, n=bootstrap),
                "cos_eg": float(ceg.mean()), "cos_eg_ci95": block_bootstrap(
                    ceg, block=block, n=bootstrap),
                "adam_rel": float(arel[half:].mean()),
                "adam_rel_ci95": block_bootstrap(arel[half:], block=block, n=bootstrap),
                "adam_perp": float(aperp[half:].mean()),
                "adam_perp_ci95": block_bootstrap(aperp[half:], block=block, n=bootstrap),
                "adam_cos": float(acos[half:].mean()),
                "adam_cos_ci95": block_bootstrap(acos[half:], block=block, n=bootstrap),
                "adam_rel_last": float(arel[-1]), "adam_cos_last": float(acos[-1])})
            res["scopes"][sname] = stats
        out["treatments"][q] = res
    out["fractions"] = _fraction_stats(fr_counts, bootstrap)
    return out


def _count(store, key, t, counts, n):
    """Add one layer's counts to step t's pooled counts of (context, operand)."""
    per_step = store.setdefault(key, {})
    c = per_step.setdefault(t, [0, 0, 0])
    c[0] += counts[0]
    c[1] += counts[1]
    c[2] += n


def _fraction_stats(counts, n_boot: int) -> dict:
    """{context: {operand: {saturated, zero_flushed (all sampled steps and layers pooled), their
    95% intervals from a bootstrap over the sampled steps}}}."""
    out: dict = {}
    for (ctx, operand), per_step in counts.items():
        rows = [per_step[t] for t in sorted(per_step)]
        tot = sum(r[2] for r in rows)
        out.setdefault(ctx, {})[operand] = {
            "saturated": sum(r[0] for r in rows) / tot,
            "zero_flushed": sum(r[1] for r in rows) / tot,
            "saturated_ci95": block_bootstrap([r[0] / r[2] for r in rows], block=1, n=n_boot),
            "zero_flushed_ci95": block_bootstrap([r[1] / r[2] for r in rows], block=1,
                                                 n=n_boot),
            "sampled_steps": len(rows)}
    return out


def analyze_run(run, out, steps=None, batches: int = 128, batch_size: int | None = None,
                data: str | None = None, treatments=None, bootstrap: int = 1000,
                **kw) -> dict:
    """The analysis from each kept checkpoint of ``run`` (a bf16 run; ``steps``: the checkpoint
    steps, default all kept ones), each from a fresh load; writes OUT/mechanism.json and .md."""
    from .checkpoint import load_checkpoint, saved_steps
    from .data import open_stream
    run = Path(run)
    steps = steps or saved_steps(run)
    if not steps:
        raise FileNotFoundError(f"no checkpoint in {run}/checkpoints")
    result = {"run": str(run), "checkpoints": {}}
    for s in steps:
        model, tok, cfg, dist, _ = load_run(run, data)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        other = [p for p in model.parameters() if p.dim() < 2]
        o = cfg.optimizer
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay},
                                 {"params": other, "weight_decay": 0.0}],
                                lr=o.lr, betas=o.betas, eps=o.eps)
        state = load_checkpoint(run, model, opt, dist, step=s)
        stream = open_stream(cfg.data.data, tok, cfg.data.seq_len, cfg.training.seed,
                             state["data"], cfg.data.data_order)
        r = analyze_checkpoint(model, opt, stream, cfg, dist, s + 1, batches, batch_size,
                               treatments, bootstrap=bootstrap, **kw)
        r["fraction_of_run"] = (s + 1) / cfg.training.max_steps
        r["tokens"] = state["tokens"]
        result["checkpoints"][str(s)] = r
        result["device"] = torch.cuda.get_device_name() if dist.device.type == "cuda" else "cpu"
    return _write_report(result, out)


def _write_report(result: dict, out) -> dict:
    """OUT/mechanism.json, .md and .png of ``result``; returns it."""
    o = Path(out)
    o.mkdir(parents=True, exist_ok=True)
    (o / "mechanism.json").write_text(json.dumps(result, indent=1))
    (o / "mechanism.md").write_text(markdown(result))
    plot_mechanism(result, o / "mechanism.png")
    return result


def plot_mechanism(result: dict, png) -> None:
    """One column per checkpoint. Top: each layer's lag-1 correlation of E⊥ per treatment (the
    structure: 0 for errors independent from step to step). Bottom: the whole model's
    accumulation over all steps (1 = independent; the true gradients' own as a dashed line),
    per-step relative error ‖E‖/‖G‖ and the Adam direction's relative error, with their 95%
    intervals where the report has them."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cks = list(result["checkpoints"].items())
    fig, axes = plt.subplots(2, len(cks), figsize=(7 * len(cks), 9), squeeze=False)
    for col, (step, c) in enumerate(cks):
        names = list(c["treatments"])
        layers = [k for k in c["treatments"][names[0]]["scopes"] if k != "model"]
        top, bottom = axes[0][col], axes[1][col]
        for q in names:
            scopes = c["treatments"][q]["scopes"]
            top.plot(range(len(layers)), [scopes[k]["cos1"] for k in layers], marker=".",
                     label=q)
        top.axhline(0, color="grey", lw=0.5)
        top.set_xticks(range(len(layers)))
        top.set_xticklabels([k.replace("layers.", "").replace("attention.", "")
                             .replace("feed_forward.", "") for k in layers],
                            rotation=90, fontsize=6)
        top.set_ylabel("cos(E⊥_t, E⊥_t−1)")
        top.set_title(f"step {step} ({c.get('fraction_of_run', 0):.0%} of the run): "
                      f"per layer, {c['steps']} steps")
        top.legend(fontsize=8)
        stats = (("acc_all", "accumulation, all steps"), ("rel_error", "‖E‖/‖G‖"),
                 ("adam_rel", "Adam direction error"))
        width = 0.8 / len(names)
        for i, q in enumerate(names):
            m = c["treatments"][q]["scopes"]["model"]
            xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(stats))]
            vals = [m[k] for k, _ in stats]
            cis = [m.get(k + "_ci95") or (v, v) for v, (k, _) in zip(vals, stats)]
            err = [[v - lo for v, (lo, _) in zip(vals, cis)],
                   [hi - v for v, (_, hi) in zip(vals, cis)]]
            bottom.bar(xs, vals, width, yerr=err, label=q, capsize=2)
        g = c["treatments"][names[0]]["scopes"]["model"].get("gradient_acc_all")
        if g is not None:
            bottom.hlines(g, -0.45, 0.45, colors="black", linestyles="dashed",
                          label="true gradients' own accumulation")
        bottom.axhline(1, color="grey", lw=0.5)
        bottom.set_xticks(range(len(stats)))
        bottom.set_xticklabels([t for _, t in stats])
        bottom.set_title("whole model")
        bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def merge_results(parts, out) -> dict:
    """One report from analyses of the same run's checkpoints made separately (each
    ``analyze_run`` output directory in ``parts``, e.g. one per checkpoint as each became
    available); writes OUT/mechanism.json, .md and .png like ``analyze_run``.

    "The same run" is checked by its path on the machine (``run``) and by the analysis
    settings; a part may still come from another training of the same arm, seed and options
    (a rerun in another hold of the machine, as in results/ablation_v2: GPU training is not
    bit-reproducible there). So every checkpoint keeps its ``source``: the part's folder, its
    run and its device; the report names it under the checkpoint, and ``device`` lists every
    device when they differ."""
    result, setting0, devices = None, None, []
    for p in parts:
        f = Path(p) / "mechanism.json"
        if not f.is_file():
            raise ValueError(f"{p}: no mechanism.json (an `ablate analyze --plan v2 --out` folder)")
        r = json.loads(f.read_text())
        if result is None:
            result = {"run": r["run"], "checkpoints": {}}
        if r["run"] != result["run"]:
            raise ValueError(f"{p}: run {r['run']!r}, not {result['run']!r}")
        for c in r["checkpoints"].values():  # one analysis, however it was split
            # a merged report's parts keep their own source
            c.setdefault("source", {"part": str(p), "run": r["run"], "device": r.get("device")})
            if c["source"]["device"] not in devices:
                devices.append(c["source"]["device"])
            setting = {k: c.get(k) for k in ("steps", "window", "max_lag", "batch_sequences",
                                             "advance")}
            setting["treatments"] = sorted(c["treatments"])
            setting0 = setting0 or setting
            if setting != setting0:
                raise ValueError(f"{p}: analyzed with {setting}, not {setting0}")
        twice = set(r["checkpoints"]) & set(result["checkpoints"])
        if twice:
            raise ValueError(f"{p}: checkpoint(s) {sorted(twice)} already in an earlier part")
        result["checkpoints"].update(r["checkpoints"])
    if result is None:
        raise ValueError("no parts to merge")
    result["checkpoints"] = dict(sorted(result["checkpoints"].items(), key=lambda kv: int(kv[0])))
    result["device"] = " / ".join(str(d) for d in devices)
    return _write_report(result, out)


def _f(v, fmt=".3f", ci=None):
    if v is None:
        return "—"
    s = format(v, fmt)
    return s if not ci else f"{s} [{format(ci[0], fmt)}, {format(ci[1], fmt)}]"


def markdown(r: dict) -> str:
    lines = [f"Run `{r['run']}` ({r.get('device', '?')}). E⊥: the Wgrad error with its component "
             "along the true gradient removed. cos1: cos(E⊥_t, E⊥_t-1); acc W: accumulation "
             "over windows of W batches (1 = independent, √W = identical); acc all: over all "
             "batches; Adam: the update direction m̂/√v̂ of shadow moments fed the quantized "
             "gradients against the true ones (second half of the steps). [95% bootstrap "
             "intervals]", ""]
    for s, c in r["checkpoints"].items():
        lines += [f"## Checkpoint after step {s} ({c['fraction_of_run']:.0%} of the run, "
                  f"{c['tokens']:,} tokens): {c['steps']} steps of {c['batch_sequences']} "
                  f"sequences, W = {c['window']}", ""]
        if "source" in c:
            src = c["source"]
            lines += [f"From `{src['part']}` (run `{src['run']}`, {src['device']}).", ""]
        lines += ["| treatment | cos1 | acc W | acc all (G's own) | rel. error | cos(E, G) | "
                  "Adam rel. error | Adam ⊥ error | Adam cos |", "|---|---|---|---|---|---|---|---|---|"]
        for q, t in c["treatments"].items():
            m = t["scopes"]["model"]
            lines.append(
                f"| {q} | {_f(m['cos1'], '+.4f', m['cos1_ci95'])} | "
                f"{_f(m['acc_w'], '.3f', m['acc_w_ci95'])} | {_f(m['acc_all'])} "
                f"({_f(m['gradient_acc_all'])}) | {_f(m['rel_error'], '.4f', m['rel_error_ci95'])} | "
                f"{_f(m['cos_eg'], '+.3f', m['cos_eg_ci95'])} | "
                f"{_f(m['adam_rel'], '.3f', m['adam_rel_ci95'])} | "
                f"{_f(m['adam_perp'], '.3f', m['adam_perp_ci95'])} | "
                f"{_f(m['adam_cos'], '.4f', m['adam_cos_ci95'])} |")
        names = list(c["treatments"])
        lines += ["", "Per layer, cos1 and acc W:", "",
                  "| layer | " + " | ".join(f"{q} cos1 | {q} acc W" for q in names) + " |",
                  "|---" * (1 + 2 * len(names)) + "|"]
        for layer in [k for k in c["treatments"][names[0]]["scopes"] if k != "model"]:
            cells = []
            for q in names:
                m = c["treatments"][q]["scopes"][layer]
                cells += [_f(m["cos1"], "+.3f"), _f(m["acc_w"], ".3f")]
            lines.append(f"| {layer} | " + " | ".join(cells) + " |")
        lines += ["", "Zero-flushed and saturated fractions (all layers pooled):", "",
                  "| context | operand | zero-flushed | saturated |", "|---|---|---|---|"]
        for ctx, ops in c["fractions"].items():
            for op, v in ops.items():
                lines.append(f"| {ctx} | {op} | {_f(v['zero_flushed'], '.4f', v['zero_flushed_ci95'])}"
                             f" | {_f(v['saturated'], '.2e', v['saturated_ci95'])} |")
        lines.append("")
    return "\n".join(lines) + "\n"

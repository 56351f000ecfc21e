"""The quantize-dequantize calls of one training step at a preset's own shapes (issue 18):
each (shape, axis) timed against a copy of a tensor of that shape and dtype in the same run,
under this GPU's default tiles and candidate tiles (along axis 0 also the both-axes module's
axis-0 kernel: ``Tuning.columns_qdq='both_axes'``), and each candidate's bits compared with
the default path's (rows) or the transpose path's (columns) on random bit patterns of that
shape. The large-shape benchmarks (gpu_bench.py, column_tile_check.py: 8192 x 14336) do not
say how the kernels run on the narrow tensors of the small presets (32768 tokens x 256-2048).

  python benchmarks/step_shapes.py [--presets 125m 30m 8b] [--out DIR]
  python benchmarks/step_shapes.py --gemms bf16 fp8 fp8_cublas [--presets ...]
  python benchmarks/step_shapes.py --both-axes [--presets ...]

With ``--gemms METHOD ...`` it times instead the step's GEMMs (``linear.recipe_gemm``, each
Linear's Fprop, Dgrad and Wgrad at its shapes, fp32 master weights) whole: in bf16 (the
reference recipe's GEMMs) and as MXFP4 GEMMs under each GEMM method (its quantize or fold
passes of both operands included), in CUDA graphs; per step, the MXFP4 GEMMs' time against
the bf16 GEMMs' for mxfp4_all (all three) and mxfp4_wgrad (Wgrad only). A method that
refuses a shape (cuBLAS's blockwise FP8 wants K in 128s) says so in its row.

With ``--both-axes`` it times, for each bf16 activation the step quantize-dequantizes along
both axes (X, ∇Y), ``quantize_dequantize_both_axes`` (one read, per tile of
``BOTH_AXES_TILES``) against the two one-axis calls under this GPU's defaults (what MXLinear
runs without ``Tuning.linear_both_axes``), bits compared, and a same-shape copy; per step, the
two ways' totals (mxfp4_all; mxfp4_all_h16 with ``--rotations hadamard16``).

A step of recipe mxfp4_all on a GPU without MX units (GEMM method bf16) quantize-dequantizes,
per layer: each Linear's input X along its features (Fprop; a shared input once: compiled
steps merge the identical calls of wq/wk/wv and of w1/w3) and along tokens (Wgrad); each
Linear's dY along its features (Dgrad) and along tokens (Wgrad); each weight (fp32 master
weights) along in_features (Fprop) and along out_features (Dgrad). mxfp4_wgrad runs only the
two along tokens. The values come out bf16 whatever the input: an fp32 weight's qdq moves 6
bytes an element against its copy's 8. Every call is timed in a CUDA graph over input sets of
at least 256 MB (no L2 hits), as a graphed training step runs it; the totals are count x time
per step (8b: per micro-batch of 8192 tokens).
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
from pathlib import Path

import torch

import gpu_bench as gb
from ocpmx import native
from ocpmx.llama_train.model import PRESETS
from ocpmx.native import ColumnTile, RowTile
from ocpmx.native.gemm import METHODS
from ocpmx.spec import parse_rotation

TOKENS = {"8b": 8192}  # tokens per GEMM: the 8b runs' micro-batch (8 sequences of 1024)
TOKENS_SMALL = 32 * 1024  # the small presets' step: 32 sequences of 1024
DEVICE = "cuda"  # (a CPU run through the interpreter checks the script, not the speed)
ROW_TILES = [RowTile(32, 1, 72), RowTile(32, 1), RowTile(16, 1), RowTile(8, 1), RowTile(64, 2),
             RowTile(128, 4)]
COLUMN_TILES = [
    ColumnTile(64, 2, 2, True, True, vec=2), ColumnTile(64, 2, 2, True, True, vec=2,
                                                        const_stride=True),
    ColumnTile(64, 1, 2, True, True, vec=2), ColumnTile(128, 2, 2, True, True, vec=2),
    ColumnTile(128, 4, 2, True, True, vec=2), ColumnTile(256, 4, 2, True, True, vec=2),
    ColumnTile(256, 8, 2, True, True, vec=2), ColumnTile(32, 1, 2, True, True, vec=2),
    ColumnTile(64, 1, 1, True, True, vec=2), ColumnTile(128, 2, 1, True, True, vec=2),
    ColumnTile(64, 2, 4, True, True, vec=2), ColumnTile(128, 4, 4, True, True, vec=2)]


BOTH_AXES_TILES = [(32, 1), (64, 1), (64, 2), (128, 2), (128, 4), (256, 4), (256, 8)]


def linears(preset: str) -> tuple[int, int, list[tuple[int, int, str]]]:
    """(tokens a GEMM contracts, layers, each Linear of a layer as (in, out, the group of
    Linears sharing its input)) of ``preset``."""
    c = PRESETS[preset]
    q, kv = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    return TOKENS.get(preset, TOKENS_SMALL), c.n_layers, [
        (c.dim, q, "attn"), (c.dim, kv, "attn"), (c.dim, kv, "attn"), (q, c.dim, "wo"),
        (c.dim, c.ffn_dim, "ffn"), (c.dim, c.ffn_dim, "ffn"), (c.ffn_dim, c.dim, "w2")]


def step_calls(preset: str) -> dict[tuple, dict]:
    """{(shape, axis, dtype): {"count": calls per step, "wgrad": along tokens (mxfp4_wgrad
    runs these)}} of one mxfp4_all step of ``preset``."""
    tokens, layers, lins = linears(preset)
    calls = collections.defaultdict(lambda: dict(count=0, wgrad=False))

    def add(shape, axis, dtype, wgrad=False):
        e = calls[(shape, axis, dtype)]
        e["count"] += layers
        e["wgrad"] = wgrad

    for k in {group: k for k, _, group in lins}.values():  # a shared input once
        add((tokens, k), 1, "bfloat16")              # Fprop X
        add((tokens, k), 0, "bfloat16", wgrad=True)  # Wgrad X
    for k, n, _ in lins:
        add((tokens, n), 1, "bfloat16")              # Dgrad dY
        add((tokens, n), 0, "bfloat16", wgrad=True)  # Wgrad dY
        add((n, k), 1, "float32")                    # Fprop W
        add((n, k), 0, "float32")                    # Dgrad W
    return dict(calls)


def step_gemms(preset: str) -> dict[tuple, int]:
    """{(gemm, a shape, a axis, b shape, b axis): calls per step} of one step of ``preset``:
    each Linear's Fprop (X, W along in), Dgrad (dY, W along out) and Wgrad (dY, X along
    tokens), as ``MXLinear`` calls ``recipe_gemm``."""
    t, layers, lins = linears(preset)
    out = collections.Counter()
    for k, n, _ in lins:
        out[("fprop", (t, k), 1, (n, k), 1)] += layers
        out[("dgrad", (t, n), 1, (n, k), 0)] += layers
        out[("wgrad", (t, n), 0, (t, k), 0)] += layers
    return dict(out)


def measure_gemms(preset: str, methods) -> list[dict]:
    """Each GEMM of ``step_gemms(preset)`` timed in bf16 and as an MXFP4 GEMM per method."""
    from ocpmx.native import recipes
    from ocpmx.native.linear import GemmContext, recipe_gemm
    rows = []
    for (gemm, a_shape, a_axis, b_shape, b_axis), count in sorted(step_gemms(preset).items()):
        # fp32 weights (the master copy MXLinear reads under autocast), bf16 activations
        a_dt, b_dt = torch.bfloat16, torch.float32 if gemm != "wgrad" else torch.bfloat16
        nbytes = a_shape[0] * a_shape[1] * 2 + b_shape[0] * b_shape[1] * b_dt.itemsize
        n = max(2, min(32, -(-256 * 2 ** 20 // nbytes)))
        inputs = [(torch.randn(a_shape, device=DEVICE, dtype=a_dt),
                   torch.randn(b_shape, device=DEVICE, dtype=b_dt)) for _ in range(n)]
        out_dtype = torch.bfloat16 if gemm == "fprop" else torch.float32
        ways = [("bf16", recipes.get_recipe("bf16").gemm(gemm), GemmContext())] + [
            (f"mxfp4 {m}", recipes.get_recipe("mxfp4_all").gemm(gemm), GemmContext(method=m))
            for m in methods]
        for name, g, ctx in ways:
            try:
                ms = gb.graphed_ms(lambda ab: recipe_gemm(gemm, g, ab[0], a_axis, ab[1], b_axis,
                                                          out_dtype, ctx), inputs)
            except Exception as e:  # a method that refuses this shape: say so, go on
                rows.append(dict(preset=preset, gemm=gemm, a=list(a_shape), b=list(b_shape),
                                 count=count, way=name,
                                 error=f"{type(e).__name__}: {str(e)[:160]}"))
                print(f"{gemm} {a_shape} x {b_shape} {name}: {rows[-1]['error']}", flush=True)
                continue
            rows.append(dict(preset=preset, gemm=gemm, a=list(a_shape), b=list(b_shape),
                             count=count, way=name, ms=ms))
            print(f"{gemm} {a_shape} x {b_shape} {name:20s} {ms * 1e3:9.1f} us", flush=True)
    return rows


def summarize_gemms(preset: str, rows, ways) -> list[str]:
    lines = [f"## {preset}: the step's GEMMs (us per call; MXFP4 with its passes)", "",
             "| GEMM | A | B | calls/step | " + " | ".join(ways) + " |",
             "|---|---|---|---|" + "---|" * len(ways)]
    keys = sorted({(r["gemm"], tuple(r["a"]), tuple(r["b"]), r["count"]) for r in rows})
    tot = collections.Counter()
    bad = collections.defaultdict(set)  # recipe -> ways that refused one of its GEMMs
    ms = {(r["gemm"], tuple(r["a"]), tuple(r["b"]), r["way"]): r.get("ms") for r in rows}
    for gemm, a, b, count in keys:
        cells = []
        for w in ways:
            t = ms[(gemm, a, b, w)]
            cells.append("refused" if t is None else f"{t * 1e3:.1f}")
            # mxfp4_wgrad: Wgrad in this way, Fprop and Dgrad in bf16
            for recipe, used in (("mxfp4_all", t), ("mxfp4_wgrad", t if gemm == "wgrad"
                                                    else ms[(gemm, a, b, "bf16")])):
                if used is None:
                    bad[recipe].add(w)
                else:
                    tot[(recipe, w)] += count * used
        lines.append(f"| {gemm} | {a[0]} x {a[1]} | {b[0]} x {b[1]} | {count} | "
                     + " | ".join(cells) + " |")
    lines += ["", "| GEMMs of a step (ms) | " + " | ".join(ways) + " |",
              "|---|" + "---|" * len(ways)]
    for r in ("mxfp4_all", "mxfp4_wgrad"):
        lines.append(f"| {r} | " + " | ".join("—" if w in bad[r] else f"{tot[(r, w)]:.2f}"
                                             for w in ways) + " |")
    return lines + ["", "(bf16: the bf16 recipe's GEMMs; mxfp4_wgrad: its Fprop and Dgrad in "
                    "bf16, Wgrad MXFP4.)", ""]


def tunings(axis: int):
    """(name, Tuning) of the default and of each candidate for a qdq along ``axis``."""
    yield "default", native.default_tuning(torch.device(DEVICE))
    if axis == 1:
        for t in ROW_TILES:
            yield str(t), dataclasses.replace(gb.GPU, rows32_qdq=t)
    else:
        yield "transpose", dataclasses.replace(gb.GPU, columns_qdq="transpose")
        for t in COLUMN_TILES:
            yield str(t), dataclasses.replace(gb.GPU, columns_qdq="kernel", cols32_qdq=t)
        yield from gb.both_axes_ways("columns_qdq", BOTH_AXES_TILES)  # the axis-0 kernel


def qdq(x, axis, rot, tun):
    return native.quantize_dequantize(x, "e2m1", axis=axis, rotation=rot, scale_rule="even",
                                      tuning=tun)


def random_bits(shape, dtype):
    g = torch.Generator(device=DEVICE).manual_seed(1)
    if dtype == torch.float32:
        w = torch.randint(-2 ** 31, 2 ** 31, shape, device=DEVICE, dtype=torch.int64,
                          generator=g).to(torch.int32)
        return w.view(torch.float32)
    w = torch.randint(-32768, 32768, shape, device=DEVICE, dtype=torch.int32, generator=g)
    return w.to(torch.int16).view(torch.bfloat16)


def measure(shape, axis, dtype_name, rotations):
    dtype = getattr(torch, dtype_name)
    nbytes = shape[0] * shape[1] * dtype.itemsize
    n = max(2, min(64, -(-256 * 2 ** 20 // nbytes)))
    inputs = [torch.randn(shape, device=DEVICE, dtype=dtype) for _ in range(n)]
    dst = torch.empty(shape, device=DEVICE, dtype=dtype)
    copy_ms = gb.graphed_ms(lambda x: dst.copy_(x), inputs)
    bits = random_bits(shape, dtype)
    rows = []
    for rot in rotations:
        # the reference bits: rows, the default's; columns, the transpose path's (a row pass)
        ref = qdq(bits, axis, rot, native.default_tuning(bits.device) if axis == 1 else
                  dataclasses.replace(gb.GPU, columns_qdq="transpose"))
        for name, tun in tunings(axis):
            try:
                same = torch.equal(qdq(bits, axis, rot, tun).view(torch.int16),
                                   ref.view(torch.int16))  # the values are bf16
                ms = gb.graphed_ms(lambda x: qdq(x, axis, rot, tun), inputs)
            except Exception as e:  # a tile that does not compile here: say so, go on
                rows.append(dict(shape=list(shape), axis=axis, dtype=dtype_name, rotation=rot,
                                 tile=name, error=f"{type(e).__name__}: {str(e)[:120]}"))
                print(f"{shape} axis={axis} rot={rot} {name}: {rows[-1]['error']}", flush=True)
                continue
            rows.append(dict(shape=list(shape), axis=axis, dtype=dtype_name, rotation=rot,
                             tile=name, ms=ms, copy_ms=copy_ms, of_copy=copy_ms / ms,
                             bits_equal=same))
            print(f"{shape} axis={axis} {dtype_name} rot={rot} {name:60s} {ms * 1e3:8.1f} us "
                  f"{copy_ms / ms:.3f} of copy" + ("" if same else " BITS DIFFER"), flush=True)
    return rows


def summarize(preset, calls, rows, rotation):
    """Per (shape, axis): calls per step, the default's and the best candidate's time and
    of-copy; totals per step for mxfp4_all (every call) and mxfp4_wgrad (along tokens)."""
    lines = [f"## {preset}, rotation {rotation}", "",
             "| shape | axis | dtype | calls/step | copy us | default us | of copy | best tile |"
             " best us | of copy |", "|---|---|---|---|---|---|---|---|---|---|"]
    tot = collections.Counter()
    for (shape, axis, dt), e in sorted(calls.items()):
        rs = [r for r in rows if tuple(r["shape"]) == shape and r["axis"] == axis
              and r["dtype"] == dt and r["rotation"] == rotation and "ms" in r]
        d = next(r for r in rs if r["tile"] == "default")
        b = min((r for r in rs if r["bits_equal"]), key=lambda r: r["ms"])
        lines.append(f"| {shape[0]} x {shape[1]} | {axis} | {dt} | {e['count']} | "
                     f"{d['copy_ms'] * 1e3:.1f} | {d['ms'] * 1e3:.1f} | {d['of_copy']:.2f} | "
                     f"{b['tile']} | {b['ms'] * 1e3:.1f} | {b['of_copy']:.2f} |")
        for key, ms in (("copy", d["copy_ms"]), ("default", d["ms"]), ("best", b["ms"])):
            tot[("mxfp4_all", key)] += e["count"] * ms
            if e["wgrad"]:
                tot[("mxfp4_wgrad", key)] += e["count"] * ms
    lines += ["", "| calls of | copies ms/step | default ms/step | best per shape ms/step |",
              "|---|---|---|---|"]
    for r in ("mxfp4_all", "mxfp4_wgrad"):
        lines.append(f"| {r} | {tot[(r, 'copy')]:.2f} | {tot[(r, 'default')]:.2f} | "
                     f"{tot[(r, 'best')]:.2f} |")
    return lines + [""]


def measure_both_axes(preset: str, rot) -> tuple[list[dict], list[str]]:
    """Each bf16 (shape) the step quantize-dequantizes along both axes (rotation ``rot``): the
    two calls against the one-pass kernel per tile (rows) and the per-step totals
    (markdown)."""
    calls = step_calls(preset)
    shapes = sorted({shape for shape, axis, dt in calls if dt == "bfloat16"
                     and (shape, 1 - axis, dt) in calls})
    rows, lines = [], [f"## {preset}, rotation {rot}: along both axes in one pass", "",
                       "| shape | calls/step | copy us | two calls us | one pass (default) us | "
                       "best tile | best us | of copy (6 bytes/elem) |",
                       "|---|---|---|---|---|---|---|---|"]
    tot = collections.Counter()
    for shape in shapes:
        count = min(calls[(shape, 0, "bfloat16")]["count"], calls[(shape, 1, "bfloat16")]["count"])
        n = max(2, min(64, -(-256 * 2 ** 20 // (shape[0] * shape[1] * 2))))
        inputs = [torch.randn(shape, device=DEVICE, dtype=torch.bfloat16) for _ in range(n)]
        dst = torch.empty(shape, device=DEVICE, dtype=torch.bfloat16)
        copy_ms = gb.graphed_ms(lambda x: dst.copy_(x), inputs)
        two_ms = gb.graphed_ms(lambda x: (qdq(x, 1, rot, None), qdq(x, 0, rot, None)), inputs)
        bits = random_bits(shape, torch.bfloat16)
        ref = (qdq(bits, 1, rot, None), qdq(bits, 0, rot, None))
        found = {}
        for bn, warps in BOTH_AXES_TILES:
            tun = dataclasses.replace(native.default_tuning(torch.device(DEVICE)),
                                      both_axes=(bn, warps))

            def both(x):
                return native.quantize_dequantize_both_axes(x, "e2m1", scale_rule="even",
                                                            rotation=rot, tuning=tun)
            got = both(bits)
            same = all(torch.equal(g.view(torch.int16), w.contiguous().view(torch.int16))
                       for g, w in zip(got, ref))
            ms = gb.graphed_ms(both, inputs)
            found[(bn, warps)] = (ms, same)
            rows.append(dict(preset=preset, shape=list(shape), rotation=rot, tile=[bn, warps],
                             ms=ms, two_calls_ms=two_ms, copy_ms=copy_ms, bits_equal=same))
            print(f"{preset} {shape} rot={rot} both axes {(bn, warps)} {ms * 1e3:8.1f} us "
                  f"(two calls {two_ms * 1e3:.1f}, copy {copy_ms * 1e3:.1f})"
                  + ("" if same else " BITS DIFFER"), flush=True)
        default = native.default_tuning(torch.device(DEVICE)).both_axes
        d_ms = found[default][0] if default in found else float("nan")
        equal = [t for t in found if found[t][1]]
        best = min(equal, key=lambda t: found[t][0]) if equal else "none: every tile's bits differ"
        b_ms = found[best][0] if equal else float("nan")
        lines.append(f"| {shape[0]} x {shape[1]} | {count} | {copy_ms * 1e3:.1f} | "
                     f"{two_ms * 1e3:.1f} | {d_ms * 1e3:.1f} | {best} | {b_ms * 1e3:.1f} | "
                     f"{copy_ms * 1.5 / b_ms:.2f} |")
        tot["copy"] += count * copy_ms
        tot["two"] += count * two_ms
        tot["default"] += count * d_ms
        tot["best"] += count * b_ms
    lines += ["", "| per step (ms) | copies | two calls | one pass (default tile) | one pass "
              "(best tile per shape) |", "|---|---|---|---|---|",
              f"| mxfp4_all{'_h16' if rot else ''}, X and ∇Y | {tot['copy']:.2f} | "
              f"{tot['two']:.2f} | "
              f"{tot['default']:.2f} | {tot['best']:.2f} |", ""]
    return rows, lines


def write(out, name: str, title: str, head: dict, rows: list, md: list[str]) -> None:
    """NAME.json (the header and the rows) and NAME.md (title, header, tables) in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    text = "\n".join([f"# {title}", "", *(f"- {k}: `{v}`" for k, v in head.items()), "", *md])
    (out / f"{name}.json").write_text(json.dumps(dict(header=head, rows=rows), indent=1))
    (out / f"{name}.md").write_text(text)
    print(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["125m", "30m"], choices=list(PRESETS))
    ap.add_argument("--rotations", nargs="+", default=["none", "hadamard16"])
    ap.add_argument("--gemms", nargs="+", metavar="METHOD",
                    choices=[m for m in METHODS if m != "emulate"],
                    help="time the step's GEMMs under these MX GEMM methods instead ('auto': "
                         "as MXLinear resolves it per GEMM, e.g. by its size on Hopper)")
    ap.add_argument("--both-axes", action="store_true",
                    help="time quantize_dequantize_both_axes against the two calls instead")
    ap.add_argument("--out", default="results/native_gpu/step_shapes")
    args = ap.parse_args()
    if args.both_axes and args.gemms:
        ap.error("--both-axes and --gemms are two measurements: one at a time")
    rots = [None if r == "none" else r for r in args.rotations]
    for r in rots:
        try:
            parse_rotation(r)
        except ValueError as e:
            ap.error(f"--rotations: {e}")
    head = gb.header()
    rows, md = [], []
    if args.both_axes:
        for preset in args.presets:
            for rot in rots:
                prows, pmd = measure_both_axes(preset, rot)
                rows += prows
                md += pmd
        write(args.out, "step_both_axes", "Quantize-dequantize along both axes in one pass",
              head, rows, md)
        raise SystemExit(1 if any(not r["bits_equal"] for r in rows) else 0)
    if args.gemms:
        ways = ["bf16"] + [f"mxfp4 {m}" for m in args.gemms]
        for preset in args.presets:
            prows = measure_gemms(preset, args.gemms)
            rows += prows
            md += summarize_gemms(preset, prows, ways)
        write(args.out, "step_gemms", "The training step's GEMMs per GEMM method", head, rows,
              md)
        return
    for preset in args.presets:
        calls = step_calls(preset)
        prows = []
        for shape, axis, dt in sorted(calls):
            prows += measure(shape, axis, dt, rots)
        rows += [dict(r, preset=preset) for r in prows]
        for rot in rots:
            md += summarize(preset, calls, prows, rot)
    write(args.out, "step_shapes", "Quantize-dequantize at the training step's shapes", head,
          rows, md)
    bad = [r for r in rows if r.get("bits_equal") is False]
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()

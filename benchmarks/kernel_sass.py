"""Instruction counts of the 32-block quantize kernels in sm_90a SASS, without a GPU.

  python benchmarks/kernel_sass.py [--fmt e2m1] [--rotations 0 16 32] [--qdq | --fold G [--pow2]]
  python benchmarks/kernel_sass.py --columns [--rotations 0 16] [--json]   # the column kernel
  python benchmarks/kernel_sass.py --fold 4 --pow2 --fold-columns 64,4 32,2  # the axis-0 fold
  python benchmarks/kernel_sass.py --both-axes 64,2,1 64,2,2  # the axis-0 quantize (blocks)
  python benchmarks/kernel_sass.py --both-axes 128,2,1 --qdq --rotations 16  # its qdq (quarters)
  python benchmarks/kernel_sass.py --fold-rows 256     # the whole-row fold of stored codes

Compiles ``quantize_rows32_kernel`` through Triton for sm_90 (Triton ships ptxas and cuobjdump)
and counts the SASS instructions: all of them, and those a program runs when it holds no NaN
or Inf (its NaN/Inf fix-ups are branched over). Each thread holds one 32-element block, so a
count / 32 is the cost per element. The second figure is the one behind the issue-bound
analysis in results/native_gpu/README.md.

``--columns``: the one-pass column kernel (``quantize_cols32_kernel``, bf16 8192 x 14336 along
axis 0, the benchmark's case) for each tile of ``gpu_bench.COLUMN_TILES``: instructions per
element, registers, register spills (STL/LDL), shared memory and warp shuffles (the layout
conversions), and the widths of its global loads and stores.
"""
from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import torch

# every SASS instruction of a disassembly but NOPs (loops, code past 64 KiB): the audit's parser
from ocpmx.audit.check import sass_instructions as all_instructions
from ocpmx.native import kernels, launch, ops
from ocpmx.native.launch import cols32_constexprs, rows32_constexprs

launch.hopper = lambda device: True  # this tool compiles for sm_90: the Hopper launch options
from ocpmx.native.tuning import GPU, ColumnTile, RowTile, Tuning
from ocpmx.spec import Rotation


def compile_rows32(fmt_name: str, rot: int, signs: bool, qdq: bool, tile: RowTile,
                   fold: tuple | None = None):
    """The row kernel with the constexprs ``native.quantize`` passes on an NVIDIA GPU (bf16
    input, the 'even' scale rule, RNE; 2^20 blocks); ``fold``: (group, pow2), the kernel
    ``native.fold.quantize_folded`` launches (sm_90's E4M3 conversion instruction)."""
    rotation = Rotation(rot, 7 if signs else None) if rot else None
    n = ops.numerics(fmt_name, "even", "rne", rotation)
    tuning = Tuning(rows32=tile, rows32_qdq=tile)
    out = None
    if fold:
        from ocpmx.native.fold import shift_range
        out = launch.FoldOutput(fold[0], None, torch.empty(0) if fold[1] else None, None, None,
                                0, shift_range(n.fmt)[1], True)
    consts, _ = rows32_constexprs(n, torch.bfloat16, 1 << 20, tuning, qdq, torch.device("cuda"),
                                  out)
    sig = {"x_ptr": "*i32", "data_ptr": "*i32" if qdq else "*u8", "scale_ptr": "*u8",
           "sign_mask": "i32", "n_blocks": "i32", "seed": "u64", "rot_scale": "fp32",
           # the fold's outputs, unused without FOLD_GROUP (the launch passes the scales)
           "exp_ptr": "*u8", "pow2_ptr": "*u8", "stats_ptr": "*u8", "total_ptr": "*u8",
           "n_rows": "i32"}
    if fold:  # the fold's outputs: exponents int32, 2^R float32, stats and total int64
        sig.update(exp_ptr="*i32", pow2_ptr="*fp32", stats_ptr="*i64", total_ptr="*i64")
    return compile_sm90(kernels.quantize.quantize_rows32_kernel, sig, consts, range(3))


def compile_sm90(fn, sig: dict, consts: dict, divisible):
    """``fn`` compiled for sm_90 as a launch would: ``sig`` its runtime arguments' types,
    ``consts`` the launch's constexprs and options (num_warps, maxnreg), the arguments at
    positions ``divisible`` specialized as divisible by 16."""
    consts = dict(consts)
    options = {"num_warps": consts.pop("num_warps")}
    maxnreg = consts.pop("maxnreg", None)
    if maxnreg:
        options["maxnreg"] = maxnreg
    src = ASTSource(fn, {**sig, **{c: "constexpr" for c in consts}},
                    constexprs={(fn.arg_names.index(c),): v for c, v in consts.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i in divisible})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_cols32(fmt_name: str, rot: int, rounding: str, tile: ColumnTile, k: int = 8192,
                   inner: int = 14336, fold: tuple | None = None):
    """The column kernel with the constexprs ``native.quantize`` passes on an NVIDIA GPU for a
    bf16 [k, inner] tensor quantized along axis 0 (the 'even' scale rule), on Hopper (the
    tile's register cap applied); ``fold``: (group, pow2), as ``compile_rows32``'s."""
    n = ops.numerics(fmt_name, "even", rounding, Rotation(rot) if rot else None)
    out = None
    if fold:
        from ocpmx.native.fold import shift_range
        out = launch.FoldOutput(fold[0], None, torch.empty(0) if fold[1] else None, None, None,
                                0, shift_range(n.fmt)[1], True)
    consts, _, _ = cols32_constexprs(n, torch.bfloat16, k, inner, k * inner, tile, False,
                                     out, on_hopper=True)
    return compile_columns(kernels.quantize.quantize_cols32_kernel, consts,
                           split=consts["SPLIT"], fold=bool(fold))


def compile_columns(kernel, consts: dict, split: bool = False, fold: bool = False):
    """A kernel with the column kernel's positional arguments (``launch.Kernel32``: the column
    kernel and the ``kernels.both_axes`` axis-0 kernels) compiled for sm_90 with ``consts``:
    bf16 input as int16 (as int32 column pairs with ``split``), the fold's outputs typed as
    the row kernel's with ``fold``, and the pointers, K and inner specialized as a launch
    specializes them (all divisible by 16)."""
    sig = {"x_ptr": "*i32" if split else "*i16", "data_ptr": "*u8", "scale_ptr": "*u8",
           "sign_mask": "i32", "K": "i32", "inner": "i32", "seed": "u64", "rot_scale": "fp32",
           "exp_ptr": "*u8", "pow2_ptr": "*u8", "stats_ptr": "*u8", "total_ptr": "*u8",
           "n_blocks": "i32", "n_rows": "i32"}
    if fold:  # the fold's outputs, as the row kernel's
        sig.update(exp_ptr="*i32", pow2_ptr="*fp32", stats_ptr="*i64", total_ptr="*i64")
    return compile_sm90(kernel, sig, consts, (0, 1, 2, 4, 5))


def compile_columns_fold(fmt_name: str, rot: int, fold: tuple, tile: tuple, k: int = 8192,
                         inner: int = 14336):
    """``kernels.both_axes.columns_fold_kernel`` as ``launch.columns32`` launches it for a
    bf16 [k, inner] tensor folded along axis 0 ('even' scale rule, RNE): ``fold`` (group,
    pow2), ``tile`` (columns, warps: ``Tuning.fold_columns``)."""
    n = ops.numerics(fmt_name, "even", "rne", Rotation(rot) if rot else None)
    from ocpmx.native.fold import shift_range
    out = launch.FoldOutput(fold[0], None, torch.empty(0) if fold[1] else None, None, None,
                            inner, shift_range(n.fmt)[1], True)
    x = torch.empty((k, inner), dtype=torch.bfloat16, device="meta")
    k32 = launch.columns32(x, k, inner, n,
                           Tuning(columns_fold="both_axes", fold_columns=tile), False, out)
    return compile_columns(k32.kernel, k32.consts, fold=True)


def both_axes_facts(fmt_name: str, rot: int, tile: tuple, k: int = 8192,
                    inner: int = 14336, qdq: bool = False) -> dict:
    """What ``kernels.both_axes.columns_kernel``'s quantize (``qdq``: quantize-dequantize,
    with a rotation from quarter loads, ``Tuning.both_axes_quarters``) compiles to as
    ``launch.columns32`` launches it for a bf16 [k, inner] tensor ('even' scale rule, RNE):
    ``tile`` (columns, warps, blocks: ``Tuning.both_axes``, ``both_axes_blocks``)."""
    n = ops.numerics(fmt_name, "even", "rne", Rotation(rot) if rot else None)
    x = torch.empty((k, inner), dtype=torch.bfloat16, device="meta")
    k32 = launch.columns32(x, k, inner, n, Tuning(columns="both_axes", both_axes=tile[:2],
                                                  both_axes_blocks=tile[2],
                                                  both_axes_quarters=qdq), qdq)
    ck = compile_columns(k32.kernel, k32.consts)
    per_thread = tile[0] * 32 * k32.consts["KB"] / (tile[1] * 32)
    return sass_facts(ck, per_thread, dict(tile=tile, rotation=rot))


def columns_fold_facts(fmt_name: str, rot: int, fold: tuple, tile: tuple) -> dict:
    """What ``columns_fold_kernel`` compiles to for one tile (as ``column_facts``)."""
    ck = compile_columns_fold(fmt_name, rot, fold, tile)
    per_thread = tile[0] * 32 * fold[0] / (tile[1] * 32)
    return sass_facts(ck, per_thread, dict(tile=tile, rotation=rot, fold=fold[0], pow2=fold[1]))


def column_facts(fmt_name: str, rot: int, rounding: str, tile: ColumnTile,
                 fold: tuple | None = None) -> dict:
    """What the column kernel compiles to for one tile (see the module doc)."""
    ck = compile_cols32(fmt_name, rot, rounding, tile, fold=fold)
    kb = tile.blocks_along(8192 // 32)
    kb = math.lcm(kb, fold[0]) if fold else kb
    per_thread = tile.columns * kb * 32 / (tile.warps * 32)
    return sass_facts(ck, per_thread, dict(tile=str(tile), rotation=rot, rounding=rounding),
                      {"fold": fold[0], "pow2": fold[1]} if fold else {})


def sass_facts(ck, per_thread: float, head: dict, after_registers: dict | None = None) -> dict:
    """``head``, the registers, ``after_registers``, then what a compiled column-shaped
    kernel ``ck`` holds: instructions per element (a thread's ``per_thread`` elements), shared
    memory, spills (STL, LDL), shared-memory traffic, shuffles and barriers, its load and
    store instructions."""
    sass = disassemble(ck.asm["cubin"])
    ops_ = [op for _, _, op, _ in all_instructions(sass)]
    count = collections.Counter(op.split(".")[0] for op in ops_)
    return dict(head, registers=registers(sass), **(after_registers or {}),
                per_element=round(len(ops_) / per_thread, 1), shared=int(ck.metadata.shared),
                **{c: count[c] for c in ("STL", "LDL", "LDS", "STS", "SHFL", "BAR")},
                loads=sorted({op for op in ops_ if op.startswith("LDG")}),
                stores=sorted({op for op in ops_ if op.startswith("STG")}))


def disassemble(cubin: bytes) -> str:
    """cuobjdump -res-usage -sass of a cubin (the tool ships in the Triton wheel)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-res-usage", "-sass", f.name], capture_output=True,
                              text=True, check=True).stdout


def registers(sass: str) -> int:
    """Registers per thread of a disassembly (they bound how many warps an SM holds)."""
    return int(re.search(r"REG:(\d+)", sass).group(1))


def sass_instructions(sass: str) -> list[tuple[int, str, str, str]]:
    """(address, predicate, opcode, operands) of each SASS instruction of a disassembly, up to
    EXIT's padding."""
    out = all_instructions(sass)
    last = max(i for i, ins in enumerate(out) if ins[2] == "EXIT")
    return out[:last + 1]


def common_path(ins: list[tuple[int, str, str, str]]) -> list[str]:
    """Opcodes executed by a program without NaN/Inf, in a kernel without loops: from the
    start to the first EXIT, jumping over each forward predicated branch's region (the NaN/Inf
    fix-ups; they run only in programs holding such a block)."""
    ops, skip_to = [], -1
    for addr, pred, op, rest in ins:
        if addr < skip_to:
            continue
        ops.append(op.split(".")[0])
        if op == "EXIT":
            break
        if op == "BRA" and pred:
            target = int(re.search(r"0x([0-9a-f]+)", rest).group(1), 16)
            if target > addr:
                skip_to = target
    return ops


def fold_rows_facts(fmt_name: str, nblk: int, words: bool) -> dict:
    """``kernels.quantize.fold_rows_kernel`` as ``native.fold._fold_rows`` launches it on sm_90
    for rows of ``nblk`` blocks (2^R too; ``words``: E2M1's integer path in 32-bit words):
    registers, spills, all instructions, and those from the integer path's load of the codes
    (its first 128-bit load) to the branch past the other path: a thread's block."""
    from ocpmx.native.fold import fold_rows_constexprs
    from ocpmx.spec import get_format
    consts = fold_rows_constexprs(get_format(fmt_name), nblk, True, True, words)[0]
    sig = dict(data_ptr="*u8", scale_ptr="*u8", out_ptr="*u8", exp_ptr="*i32",
               pow2_ptr="*fp32", stats_ptr="*i64", row_ptr="*i64", n_blocks_row="i32")
    sass = disassemble(compile_sm90(kernels.quantize.fold_rows_kernel, sig, consts,
                                    (0, 1, 2, 7)).asm["cubin"])
    ins = sass_instructions(sass)
    start = next((i for i, v in enumerate(ins) if v[2].startswith("LDG.E.128")), None)
    end = next((i for i, v in enumerate(ins[start:], start) if v[2] == "BRA" and not v[1]),
               None) if start is not None else None
    return dict(fmt=fmt_name, blocks=nblk, words=words, registers=registers(sass),
                spills=sass.count("STL"), instructions=len(ins),
                integer_path=None if end is None else end - start + 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fmt", default="e2m1")
    ap.add_argument("--rotations", nargs="+", type=int, default=[0, 16, 32])
    ap.add_argument("--qdq", action="store_true", help="the quantize-dequantize variant")
    ap.add_argument("--fold", type=int, metavar="GROUP",
                    help="the fold into E4M3 in groups of GROUP blocks (quantize_folded)")
    ap.add_argument("--pow2", action="store_true", help="with --fold: 2^R for cuBLAS too")
    ap.add_argument("--tile", nargs="+", type=int,
                    help="rows: BLOCKS WARPS (default: the kernel's GPU default); --columns: "
                         "COLUMNS WARPS [KBLOCKS HIDE KB_FAST VEC MAXNREG SPLIT CONST_STRIDE "
                         "SERIAL JOINT QUARTERS] (ColumnTile's fields; MAXNREG 0: no cap)")
    ap.add_argument("--columns", action="store_true",
                    help="the column kernel, for each of gpu_bench.COLUMN_TILES (or --tile)")
    ap.add_argument("--rounding", nargs="+", default=["rne"], help="with --columns")
    ap.add_argument("--fold-columns", nargs="+", metavar="COLUMNS,WARPS",
                    help="with --fold: kernels.both_axes.columns_fold_kernel per tile")
    ap.add_argument("--both-axes", nargs="+", metavar="COLUMNS,WARPS,BLOCKS",
                    help="kernels.both_axes.columns_kernel's quantize along axis 0 per tile "
                         "(with --qdq: its quantize-dequantize, a rotation from quarter loads)")
    ap.add_argument("--json", action="store_true",
                    help="with --columns: one JSON list; with --both-axes: a JSON object a line")
    ap.add_argument("--quarter-form", type=int, choices=(1, 2),
                    help="with --columns (and --both-axes --qdq): load a quarters tile's "
                         "quarters in this form (kernels.quantize.column_quarter), not the "
                         "installed Triton's")
    ap.add_argument("--fold-rows", type=int, metavar="BLOCKS",
                    help="fold_rows_kernel for rows of BLOCKS blocks, E2M1's integer path in "
                         "32-bit words and a byte at a time")
    args = ap.parse_args()
    if args.fold_rows:
        for words in (True, False):
            f = fold_rows_facts(args.fmt, args.fold_rows, words)
            print(" ".join(f"{k} {v}" for k, v in f.items()), flush=True)
        return
    if args.quarter_form:
        launch.quarter_form = lambda: args.quarter_form
    if args.fold is not None and (args.fold < 1 or args.fold & (args.fold - 1)):
        ap.error(f"--fold takes a power of two, got {args.fold}")
    if args.pow2 and not args.fold:
        ap.error("--pow2 goes with --fold")
    if args.fold and args.qdq:
        ap.error("--fold and --qdq are two kernels: one at a time")
    if args.both_axes:
        for t in args.both_axes:
            tile = tuple(int(v) for v in t.split(","))
            for rot in args.rotations:
                f = both_axes_facts(args.fmt, rot, tile, qdq=args.qdq)
                if args.json:
                    print(json.dumps(f), flush=True)
                else:
                    print(" ".join(f"{k} {v}" for k, v in f.items()), flush=True)
        return
    if args.fold_columns:
        if not args.fold:
            ap.error("--fold-columns goes with --fold GROUP")
        for t in args.fold_columns:
            cols, warps = (int(v) for v in t.split(","))
            for rot in args.rotations:
                f = columns_fold_facts(args.fmt, rot, (args.fold, args.pow2), (cols, warps))
                print(" ".join(f"{k} {v}" for k, v in f.items()), flush=True)
        return
    if args.columns:
        if args.tile:
            if not 2 <= len(args.tile) <= 12:
                ap.error("--columns --tile takes COLUMNS WARPS [KBLOCKS HIDE KB_FAST VEC "
                         "MAXNREG SPLIT CONST_STRIDE SERIAL JOINT QUARTERS]")
            c = args.tile + [1, 1, 0, 1, 0, 0, 0, 0, 0, 0][len(args.tile) - 2:]
            tiles = [ColumnTile(c[0], c[1], c[2], bool(c[3]), bool(c[4]), c[5], c[6] or None,
                                bool(c[7]), bool(c[8]), bool(c[9]), bool(c[10]), bool(c[11]))]
        else:
            from gpu_bench import COLUMN_TILES
            tiles = COLUMN_TILES
        fold = (args.fold, args.pow2) if args.fold else None
        facts = [column_facts(args.fmt, rot, rnd, t, fold) for rot in args.rotations
                 for rnd in args.rounding for t in tiles]
        if args.json:
            print(json.dumps(facts))
        for f in facts if not args.json else ():
            print(" ".join(f"{k} {v}" for k, v in f.items()))
        return
    if args.tile and len(args.tile) != 2:
        ap.error("--tile takes BLOCKS WARPS for the row kernel")
    tile = RowTile(*args.tile) if args.tile else (GPU.rows32_qdq if args.qdq else GPU.rows32)
    print(f"tile: {tile.blocks} blocks, {tile.warps} warps, register cap {tile.maxnreg}")
    for rot in args.rotations:
        for signs in ((False, True) if rot else (False,)):
            ck = compile_rows32(args.fmt, rot, signs, args.qdq, tile,
                                (args.fold, args.pow2) if args.fold else None)
            sass = disassemble(ck.asm["cubin"])
            ins = sass_instructions(sass)
            ops = common_path(ins)
            regs = registers(sass)
            top = ", ".join(f"{k} {v}" for k, v in collections.Counter(ops).most_common(8))
            print(f"{args.fmt} rotation {rot:2d}{' random signs' if signs else '             '}"
                  f"{' qdq' if args.qdq else ''}"
                  f"{f' fold {args.fold}' + (' pow2' if args.pow2 else '') if args.fold else ''}"
                  f": {len(ins)} instructions "
                  f"({len(ins) / 32:.2f} per element); without NaN/Inf {len(ops)} "
                  f"({len(ops) / 32:.2f} per element: {top}); registers {regs}")

if __name__ == "__main__":
    main()

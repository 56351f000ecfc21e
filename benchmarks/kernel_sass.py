"""Instruction counts of the 32-block quantize row kernel in sm_90a SASS, without a GPU.

  python benchmarks/kernel_sass.py [--fmt e2m1] [--rotations 0 16 32] [--qdq]

Compiles ``quantize_rows32_kernel`` through Triton for sm_90 (Triton ships ptxas and cuobjdump)
and counts the SASS instructions: all of them, and those a program runs when it holds no NaN
or Inf (its NaN/Inf fix-ups are branched over). Each thread holds one 32-element block, so a
count / 32 is the cost per element. The second figure is the one behind the issue-bound
analysis in results/native_gpu/README.md.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import torch

from ocpmx.native import kernels, launch, ops
from ocpmx.native.launch import rows32_constexprs

launch.hopper = lambda device: True  # this tool compiles for sm_90: the Hopper launch options
from ocpmx.native.tuning import GPU, RowTile, Tuning
from ocpmx.spec import Rotation


def compile_rows32(fmt_name: str, rot: int, signs: bool, qdq: bool, tile: RowTile):
    """The row kernel with the constexprs ``native.quantize`` passes on an NVIDIA GPU (bf16
    input, the 'even' scale rule, RNE; 2^20 blocks)."""
    rotation = Rotation(rot, 7 if signs else None) if rot else None
    n = ops.numerics(fmt_name, "even", "rne", rotation)
    tuning = Tuning(rows32=tile, rows32_qdq=tile)
    consts, _ = rows32_constexprs(n, torch.bfloat16, 1 << 20, tuning, qdq, torch.device("cuda"))
    warps, maxnreg = consts.pop("num_warps"), consts.pop("maxnreg", None)
    fn = kernels.quantize.quantize_rows32_kernel
    sig = {"x_ptr": "*i32", "data_ptr": "*i32" if qdq else "*u8", "scale_ptr": "*u8",
           "sign_mask": "i32", "n_blocks": "i32", "seed": "u64", "rot_scale": "fp32",
           # the fold's outputs, unused without FOLD_GROUP (the launch passes the scales)
           "exp_ptr": "*u8", "pow2_ptr": "*u8", "stats_ptr": "*u8", "total_ptr": "*u8",
           "n_rows": "i32", **{k: "constexpr" for k in consts}}
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i in range(3)})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=warps, **({"maxnreg": maxnreg} if maxnreg else {})))


def disassemble(cubin: bytes) -> str:
    """cuobjdump -res-usage -sass of a cubin (the tool ships in the Triton wheel)."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, "-res-usage", "-sass", f.name], capture_output=True,
                              text=True, check=True).stdout


def registers(cubin: bytes) -> int:
    """Registers per thread (they bound how many warps an SM holds)."""
    return int(re.search(r"REG:(\d+)", disassemble(cubin)).group(1))


def sass_instructions(cubin: bytes) -> list[tuple[int, str, str, str]]:
    """(address, predicate, opcode, operands) of each SASS instruction, up to EXIT's padding."""
    sass = disassemble(cubin)
    out = []
    for addr, pred, op, rest in re.findall(
            r"/\*([0-9a-f]{4})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);", sass):
        out.append((int(addr, 16), pred.strip(), op, rest))
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fmt", default="e2m1")
    ap.add_argument("--rotations", nargs="+", type=int, default=[0, 16, 32])
    ap.add_argument("--qdq", action="store_true", help="the quantize-dequantize variant")
    ap.add_argument("--tile", nargs=2, type=int, metavar=("BLOCKS", "WARPS"),
                    help="blocks per tile and warps (default: the kernel's GPU default)")
    args = ap.parse_args()
    tile = RowTile(*args.tile) if args.tile else (GPU.rows32_qdq if args.qdq else GPU.rows32)
    print(f"tile: {tile.blocks} blocks, {tile.warps} warps, register cap {tile.maxnreg}")
    for rot in args.rotations:
        for signs in ((False, True) if rot else (False,)):
            ck = compile_rows32(args.fmt, rot, signs, args.qdq, tile)
            ins = sass_instructions(ck.asm["cubin"])
            ops = common_path(ins)
            regs = registers(ck.asm["cubin"])
            top = ", ".join(f"{k} {v}" for k, v in collections.Counter(ops).most_common(8))
            print(f"{args.fmt} rotation {rot:2d}{' random signs' if signs else '             '}"
                  f"{' qdq' if args.qdq else ''}: {len(ins)} instructions "
                  f"({len(ins) / 32:.2f} per element); without NaN/Inf {len(ops)} "
                  f"({len(ops) / 32:.2f} per element: {top}); registers {regs}")

if __name__ == "__main__":
    main()

"""Compile a recorded launch for a chip without the chip, and check what came out.

Per chip a small table of facts (``ARCHS``): the Triton target, the shared-memory (LDS) limit
per block, the MX matrix instruction ``tl.dot_scaled`` must become, the markers of Triton's
bf16 decomposition (its fallback where the MX instruction does not apply), and the hardware
conversion instructions the quantize and dequantize kernels must not contain (their bits rest
on integer arithmetic).

A launch is compiled the way ``JITFunction.run`` compiles it (Triton's own binder specializes
the arguments, ``_pack_args`` splits constexprs, attributes and options), with stand-ins for
the tensors (an aligned address plus the recorded offset, the recorded storage size), then
``triton.compile(ASTSource(...), target=...)``. ``compile_launch`` runs in a fresh process
without TRITON_INTERPRET (under the interpreter ``@triton.jit`` gives functions that cannot be
compiled).
"""
from __future__ import annotations

import collections
import importlib
import os
import re
import subprocess
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass

GEMM_KERNELS = ("mx_gemm_kernel",)


# kernels that convert through gfx950's instructions (conversion='gfx950'): each variant must
# hold the instruction its constexprs name (INSN), the other conversion kernels none
HW_CONVERSION_KERNELS = ("quantize_gfx950_kernel",)


def is_conversion_kernel(name: str) -> bool:
    """The quantize and dequantize kernels (any the package adds): integer arithmetic only,
    except the variants of ``HW_CONVERSION_KERNELS`` that use the instructions (``HW``), which
    ``analyze`` checks first."""
    return re.match(r"(de)?quantize_\w*kernel$", name) is not None


# MX element format -> operand-format code of the instruction
AMD_FORMAT_CODES = {"e4m3": 0, "e5m2": 1, "e2m3": 2, "e3m2": 3, "e2m1": 4}  # cbsz / blgp
# tcgen05.mma instruction descriptor, atype (bits 7-9) and btype (bits 10-12) (PTX ISA,
# "Instruction descriptor" of .kind::mxf8f6f4 / .kind::mxf4)
NV_FORMAT_CODES = {"mxf8f6f4": {"e4m3": 0, "e5m2": 1, "e2m3": 3, "e3m2": 4, "e2m1": 5},
                   "mxf4": {"e2m1": 1}}


@dataclass(frozen=True)
class Arch:
    name: str
    vendor: str           # 'amd' or 'nvidia'
    backend: str          # Triton's backend name
    arch: object          # GPUTarget's arch: 'gfx950' or 100
    warp_size: int
    lds_limit: int        # shared memory per block, bytes
    mx_instruction: str   # regex: the scaled MX matrix instruction
    fallback: tuple       # regexes: the bf16 decomposition
    forbidden_convert: tuple  # regexes: hardware conversions banned in quantize / dequantize
    notes: str = ""

    @property
    def target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget(self.backend, self.arch, self.warp_size)

    def make_backend(self):
        from triton.compiler import make_backend
        return make_backend(self.target)


ARCHS = {a.name: a for a in [
    Arch("gfx950", "amd", "hip", "gfx950", 64, 160 * 1024,
         mx_instruction=r"\bv_mfma_scale_f32_(?:32x32x64|16x16x128)_f8f6f4\b",
         fallback=(r"\bv_cvt_scalef32_pk_bf16_(?:fp4|fp8|bf8)\b", r"\bv_mfma_f32_\w*bf16\b"),
         forbidden_convert=(r"\bv_cvt_scalef32_\w+", r"\bv_cvt_pk_(?:fp8|bf8)_\w+",
                            r"\bv_cvt_sr_\w+", r"\bv_cvt_(?:pk_)?f32_(?:fp8|bf8)\w*"),
         notes="MI355X (CDNA4): LDS 160 KiB per workgroup; ISA from Triton's .amdgcn text"),
    Arch("sm_100a", "nvidia", "cuda", 100, 32, 232448,
         mx_instruction=r"\btcgen05\.mma\.cta_group::\d\.kind::(?:mxf4|mxf8f6f4)\.block_scale",
         fallback=(r"\bmma\.sync\.aligned\.\S*bf16", r"\bcvt\.rn\.bf16x2\.e\dm\dx2\b",
                   r"\btcgen05\.mma\.cta_group::\d\.kind::(?:f16|tf32)\b", r"\bU?HMMA\b",
                   r"\bUTCHMMA\b"),
         forbidden_convert=(r"\bcvt\.[\w.]*?(?:e2m1|e4m3|e5m2|e2m3|e3m2|ue8m0)[\w.]*",
                            r"\bF2FP\.[\w.]*(?:E2M1|E4M3|E5M2|E2M3|E3M2|UE8M0)"),
         notes="B200 (Blackwell): 227 KiB shared memory per block (opt-in); PTX and SASS "
               "(ptxas and cuobjdump from the Triton wheel)"),
]}


# ---------------------------------------------------------------------------------------------
# compiling (in a worker process)

def init_worker():
    """A compile worker: the kernels must be JITFunctions, so no interpreter."""
    os.environ.pop("TRITON_INTERPRET", None)
    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")


def _jit_function(name: str):
    module, fn = name.split(":")
    return getattr(importlib.import_module(module), fn)


def compile_launch(arch: Arch, launch):
    """Compile one recorded launch as ``JITFunction.run`` would; the CompiledKernel."""
    import torch
    import triton
    from triton.compiler import ASTSource
    from triton.runtime.jit import create_function_from_signature

    from .record import _Standin

    fn = _jit_function(launch.kernel)
    backend = arch.make_backend()
    args = [_Standin(getattr(torch, a[1]), a[2], a[3])
            if isinstance(a, tuple) and a[:1] == ("tensor",) else a for a in launch.args]
    kwargs = {**dict(launch.constexprs), **dict(launch.options),
              # the options JITFunction.run adds
              "debug": fn.debug or triton.knobs.runtime.debug,
              "instrumentation_mode": triton.knobs.compilation.instrumentation_mode,
              "fpsan_homomorphic_casts": triton.knobs.compilation.fpsan_homomorphic_casts}
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, _ = binder(*args, **kwargs)
    again = tuple(tuple(s[:2]) for s in specialization[:len(launch.spec)])
    if again != launch.spec:  # the stand-ins must specialize as the recorded tensors did
        raise RuntimeError(f"specialization {again} differs from the recorded {launch.spec}")
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound,
                                                          specialization, None)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=arch.target,
                          options=options.__dict__)


def audit_launch(arch: Arch, launch) -> dict:
    """Compile and check one launch: a JSON-ready result (status 'pass', 'fail' or 'error')."""
    t0 = time.perf_counter()
    try:
        kernel = compile_launch(arch, launch)
    except Exception as e:
        return {"status": "error", "failures": [f"compile failed: {type(e).__name__}: "
                                                 f"{_first_line(e)}"],
                "error": traceback.format_exc(limit=3)[-2000:],
                "compile_s": round(time.perf_counter() - t0, 2)}
    result = analyze(arch, launch, kernel)
    result["compile_s"] = round(time.perf_counter() - t0, 2)
    return result


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else ""


# ---------------------------------------------------------------------------------------------
# checking

def analyze(arch: Arch, launch, kernel) -> dict:
    """The checks of one compiled launch (see the module doc)."""
    meta = kernel.metadata
    facts = _amd_facts(kernel) if arch.vendor == "amd" else _nvidia_facts(kernel)
    text = facts.pop("text")
    consts = dict(launch.constexprs)
    failures = []
    shared = int(meta.shared)
    if shared > arch.lds_limit:
        failures.append(f"shared memory {shared} B over the limit {arch.lds_limit} B")
    if facts["spills"]:
        failures.append(f"register spills / scratch: {facts['spills']}")
    out = {"shared_bytes": shared, "num_warps": meta.num_warps, "num_stages": meta.num_stages}
    if launch.name in GEMM_KERNELS:
        mx = re.findall(arch.mx_instruction, text)
        fallback = sorted({m for pat in arch.fallback for m in re.findall(pat, text)})
        if not mx:
            failures.append("no MX matrix instruction")
        if fallback:
            failures.append("bf16 decomposition: " + ", ".join(fallback))
        fields = (_amd_fields if arch.vendor == "amd" else _nvidia_fields)(
            text, consts["FMT_A"], consts["FMT_B"])
        failures += fields.pop("failures")
        out["mx_instruction"] = fields.pop("instruction", None)
        out["mx_count"] = len(mx)
        out["operand_formats"] = fields
    elif launch.name in HW_CONVERSION_KERNELS and consts.get("HW", True):
        want = consts["INSN"]
        found = sorted(set(re.findall(r"\bv_cvt_scalef32_\w+", text)))
        if arch.name != "gfx950":
            failures.append(f"{launch.name} is for gfx950 only")
        elif want not in found:
            failures.append(f"no {want} (conversions found: {', '.join(found) or 'none'})")
        elif set(found) - {want}:
            failures.append(f"other conversions beside {want}: {sorted(set(found) - {want})}")
        out["conversions"] = found
        out["conversion_count"] = len(re.findall(rf"\b{want}\b", text))
    elif is_conversion_kernel(launch.name):
        found = sorted({m for pat in arch.forbidden_convert for m in re.findall(pat, text)})
        if found:
            failures.append("hardware conversion instructions: " + ", ".join(found))
        out["conversions"] = found
    out.update(facts)
    out["failures"] = failures
    out["status"] = "fail" if failures else "pass"
    return out


def _amd_facts(kernel) -> dict:
    asm = kernel.asm["amdgcn"]
    name = kernel.metadata.name
    body = asm[asm.index(f"\n{name}:"):asm.index("\n.Lfunc_end")]
    ops = re.findall(r"^\t([a-z][a-z0-9_]*)\b", body, re.M)

    def number(key):
        m = re.search(rf"^[\s-]*\.?{re.escape(key)}:?\s+(\d+)", asm, re.M)
        return int(m.group(1)) if m else None

    spills = {k: v for k, v in [("vgpr_spill_count", number("vgpr_spill_count")),
                                ("sgpr_spill_count", number("sgpr_spill_count")),
                                ("private_segment_fixed_size",
                                 number("private_segment_fixed_size")),
                                ("ScratchSize", _scratch(asm))] if v}
    return {"text": body, "instructions": len(ops), "spills": spills,
            "registers": {"vgpr": number("vgpr_count"), "agpr": number("agpr_count"),
                          "sgpr": number("sgpr_count")},
            "top_instructions": _top(ops)}


def _scratch(asm: str) -> int | None:
    m = re.search(r"; ScratchSize: (\d+)", asm)
    return int(m.group(1)) if m else None


# one SASS instruction of a cuobjdump -sass listing: /*address*/ [@predicate] OPCODE operands;
# addresses take 4 to 6 hex digits (past 64 KiB of code: 5)
SASS_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,6})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def sass_instructions(sass: str) -> list[tuple[int, str, str, str]]:
    """(address, predicate, opcode, operands) of every instruction of a SASS listing but NOPs
    (also ``benchmarks/kernel_sass.py``'s parser)."""
    return [(int(a, 16), p.strip(), op, rest) for a, p, op, rest in SASS_INSTRUCTION.findall(sass)
            if op != "NOP"]


def _nvidia_facts(kernel) -> dict:
    ptx = kernel.asm["ptx"]
    sass = _cuobjdump(kernel.asm["cubin"], "-sass")
    res = _cuobjdump(kernel.asm["cubin"], "-res-usage")
    usage = {k: int(v) for k, v in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", res)}
    ops = [op for _, _, op, _ in sass_instructions(sass)]
    # spills: the local-memory stores and loads ptxas adds (STL / LDL in the SASS)
    spills = {k: v for k, v in [("STL", sum(op.startswith("STL") for op in ops)),
                                ("LDL", sum(op.startswith("LDL") for op in ops)),
                                ("LOCAL", usage.get("LOCAL", 0))] if v}
    mx_sass = sorted({op for op in ops if re.match(r"UTC\w*MMA", op)})
    return {"text": ptx + "\n" + sass, "instructions": len(ops), "spills": spills,
            "registers": {"reg": usage.get("REG", 0), "stack_frame": usage.get("STACK", 0)},
            "ptx_target": (re.search(r"^\.target\s+(\S+)", ptx, re.M) or [None, None])[1],
            "sass_mma": mx_sass, "top_instructions": _top([op.split(".")[0] for op in ops])}


def _cuobjdump(cubin: bytes, flag: str) -> str:
    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True,
                              check=True).stdout


def _top(ops: list[str], n: int = 6) -> dict:
    return dict(collections.Counter(ops).most_common(n))


def _amd_fields(text: str, fmt_a: str, fmt_b: str) -> dict:
    """cbsz (A's format) and blgp (B's format) of every scaled MFMA; Triton may emit them with
    the operands swapped (a transposed MFMA layout), so the pair must match either way, and
    the same way on every instruction."""
    lines = re.findall(r"\b(v_mfma_scale_f32_\w+)\b([^\n]*)", text)
    want = (AMD_FORMAT_CODES.get(fmt_a), AMD_FORMAT_CODES.get(fmt_b))
    pairs = collections.Counter()
    for _, rest in lines:
        cbsz = re.search(r"\bcbsz:(\d+)", rest)
        blgp = re.search(r"\bblgp:(\d+)", rest)
        pairs[(int(cbsz.group(1)) if cbsz else 0, int(blgp.group(1)) if blgp else 0)] += 1
    failures = []
    order = None
    if pairs:
        if set(pairs) == {want}:
            order = "A,B"
        elif set(pairs) == {want[::-1]}:
            order = "B,A (operands swapped)"
        else:
            failures.append(f"operand formats (cbsz, blgp) {sorted(pairs)} do not match "
                            f"{fmt_a} x {fmt_b} = {want}")
    return {"instruction": sorted({name for name, _ in lines}) or None,
            "expected": {"cbsz/blgp": list(want)},
            "found": [list(p) for p in sorted(pairs)], "order": order, "failures": failures}


def _nvidia_fields(text: str, fmt_a: str, fmt_b: str) -> dict:
    """The kind of every tcgen05.mma (mxf4 for e2m1 x e2m1, else mxf8f6f4) and the A/B type
    fields of its instruction descriptor (a mov.b32 immediate in the PTX)."""
    kind_want = "mxf4" if fmt_a == fmt_b == "e2m1" else "mxf8f6f4"
    codes = NV_FORMAT_CODES[kind_want]
    want = (codes.get(fmt_a), codes.get(fmt_b))
    failures, found, kinds = [], collections.Counter(), collections.Counter()
    for kind, idesc in re.findall(
            r"tcgen05\.mma\.cta_group::\d\.kind::(\w+?)\.block_scale\S*\s+[^,]+,[^,]+,[^,]+,\s*(%r\d+)",
            text):
        kinds[kind] += 1
        mov = re.search(rf"mov\.b32\s+{re.escape(idesc)},\s*(\d+);", text)
        if mov is None:
            found["descriptor not an immediate"] += 1
            continue
        v = int(mov.group(1))
        found[((v >> 7) & 7, (v >> 10) & 7)] += 1
    if kinds and set(kinds) != {kind_want}:
        failures.append(f"tcgen05.mma kind {sorted(kinds)}, expected {kind_want}")
    pairs = {p for p in found if isinstance(p, tuple)}
    if pairs and pairs != {want}:
        failures.append(f"instruction-descriptor (atype, btype) {sorted(pairs)} do not match "
                        f"{fmt_a} x {fmt_b} = {want}")
    return {"instruction": sorted(f"tcgen05.mma kind::{k}" for k in kinds) or None,
            "expected": {"kind": kind_want, "atype/btype": list(want)},
            "found": [list(p) if isinstance(p, tuple) else p for p in found],
            "failures": failures}


def probe(arch: Arch) -> str | None:
    """None if Triton can compile for ``arch`` here, else why not (one line)."""
    import triton
    import triton.language as tl
    from triton.compiler import ASTSource

    @triton.jit
    def _probe(x_ptr):
        tl.store(x_ptr, 1.0)

    try:
        triton.compile(ASTSource(_probe, {"x_ptr": "*fp32"}, {}, {}),
                       target=arch.target)
    except Exception as e:
        return f"Triton {triton.__version__} cannot compile for {arch.name}: " \
               f"{type(e).__name__}: {_first_line(e)}"
    return None

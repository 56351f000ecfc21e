"""Which kernel variants the project launches: a workload through the public API with
``ocpmx.native.launch.run`` (every launch of the package goes through it) replaced by a recorder.

Nothing runs on a device. The workload uses small CPU tensors; while it records,
  * ``launch.run`` records (kernel, positional arguments, constexprs and launch options) and
    launches nothing (outputs stay uninitialized: only shapes and dtypes matter here);
  * the interpreter switch reads off (TRITON_INTERPRET=0), so the GPU tunings and the
    autotuned GEMM are chosen as on a GPU;
  * ``pick_backend`` answers 'triton' for CPU tensors (the backend a GPU tensor gets);
  * ``dispatch.nvidia``, ``dispatch.hopper``, ``dispatch.blackwell`` and ``dispatch.gfx950``
    answer as the audited chip does (the register cap is for Hopper only; the GEMM prunes
    spilling tiles on sm_100; on gfx950 the workload adds ``conversion='gfx950'`` quantizes,
    the hardware-conversion kernel);
  * ``gemm.has_mx_units`` answers True (both audited chips have MX units: method 'auto' is
    'dot_scaled', as on the chip);
  * ``gemm._smem_limit`` answers the chip's shared memory, so the autotuner's own prune
    decides which configs can reach a launch there.
An autotuned launch is recorded once per config, marked reachable or pruned.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import sys
from dataclasses import dataclass, field

import torch

ROTATIONS = ("none", "hadamard16", "hadamard32", "random_sign16:7", "random_sign32:7")
SCALE_RULES = ("floor", "ceil", "rceil", "even")
ALL_FORMATS = ("e2m1", "e4m3", "e5m2", "e3m2", "e2m3", "int8")
GEMM_FORMATS = ("e2m1", "e4m3", "e5m2")
DTYPES = (torch.bfloat16, torch.float32, torch.float16)
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
BASE_PTR = 1 << 40  # a device allocation's address: 256-byte aligned


@dataclass(frozen=True)
class Launch:
    """One recorded launch, in plain values (it crosses to the compile workers).

    kernel      'module:function' of the @triton.jit function
    spec        Triton's specialization of each positional argument on the chip, as the JIT
                computes it: (type, attributes), e.g. ('*u8', 'DS'), ('i32', 'D')
    constexprs  sorted (name, value) of the keyword arguments that are kernel parameters
    options     sorted (name, value) of the launch options (num_warps, num_stages, maxnreg)
    config      the autotune config ('BMxBNxBK w8 s3'), or None for a direct launch
    reachable   False for an autotune config the autotuner prunes on this chip
    args        the first such launch's positional arguments: ('tensor', dtype, byte offset,
                storage bytes) or the Python scalar (the workers specialize them again)
    origin      the public call that launched it (the first one)
    Launches that differ only in ``args`` and ``origin`` compile to the same code.
    """

    kernel: str
    spec: tuple
    constexprs: tuple
    options: tuple
    config: str | None = None
    reachable: bool = True
    args: tuple = field(default=(), compare=False)
    origin: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        return self.kernel.rsplit(":", 1)[1]


def kernel_name(kernel) -> str:
    """'module:function' of a JITFunction, an InterpretedFunction or an Autotuner over one."""
    while not hasattr(kernel, "__code__"):
        kernel = kernel.fn
    return f"{kernel.__module__}:{kernel.__qualname__}"


class _Standin:
    """A tensor as Triton's specialization sees it: dtype, address, storage range."""

    def __init__(self, dtype, offset: int, nbytes: int):
        self.dtype, self._ptr, self._bytes = dtype, BASE_PTR + offset, nbytes

    def data_ptr(self) -> int:
        return self._ptr

    def ptr_range(self) -> int:
        return self._bytes


class Recorder:
    """Collects ``Launch`` records for ``arch``; ``origin`` names the public call being run;
    ``big``: size every launch's tensors as if its largest held 2^31 elements."""

    def __init__(self, arch):
        from triton._C.libtriton import native_specialize_impl
        self.arch = arch
        self.backend = arch.make_backend()
        self.specialize = native_specialize_impl
        # its first call imports Triton modules that must see the interpreter switch as it
        # was when the kernels were decorated, not as ``recording`` sets it
        self.specialize(self.backend, _Standin(torch.uint8, 0, 1), False, True, True)
        self.launches: list[Launch] = []
        self.origin = ""
        self.big = False

    def _args(self, kernel, args) -> tuple[tuple, tuple]:
        numel = max((a.numel() for a in args if isinstance(a, torch.Tensor)), default=1)
        factor = 2**31 / max(numel, 1) if self.big else 1
        dns, dns_align = _not_specialized(kernel)
        margs, spec = [], []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                nbytes = int(a.untyped_storage().size() * factor)
                margs.append(("tensor", str(a.dtype).removeprefix("torch."),
                              a.storage_offset() * a.element_size(), nbytes))
                s = _Standin(a.dtype, margs[-1][2], nbytes)
            else:
                margs.append(a)
                s = a
            spec.append(tuple(self.specialize(self.backend, s, False, i not in dns,
                                              i not in dns_align)))
        return tuple(margs), tuple(spec)

    def run(self, kernel, grid, *args, **kwargs):
        name = kernel_name(kernel)
        options = {k: v for k, v in kwargs.items() if k in LAUNCH_OPTIONS}
        consts = {k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS}
        margs, spec = self._args(kernel, args)
        if hasattr(kernel, "configs"):  # triton.autotune: every config it could pick here
            kernel.nargs = dict(zip(kernel.arg_names, args))
            try:
                kept = kernel.prune_configs(kwargs)
            finally:
                kernel.nargs = None
            for c in kernel.configs:
                opts = {**options, "num_warps": c.num_warps, "num_stages": c.num_stages,
                        **({"maxnreg": c.maxnreg} if c.maxnreg else {})}
                self.launches.append(Launch(name, spec, _items({**consts, **c.kwargs}),
                                            _items(opts), config_label(c), c in kept, margs,
                                            self.origin))
        else:
            self.launches.append(Launch(name, spec, _items(consts), _items(options), None, True,
                                        margs, self.origin))


def _not_specialized(kernel) -> tuple[set, set]:
    """Indices of the parameters ``@triton.jit(do_not_specialize=...,
    do_not_specialize_on_alignment=...)`` exempts (a JITFunction, or the interpreter's
    stand-in for one, under any autotuner)."""
    while hasattr(kernel, "configs"):
        kernel = kernel.fn
    opts = getattr(kernel, "kwargs", None)  # InterpretedFunction keeps the jit arguments
    if opts is None:
        opts = {"do_not_specialize": kernel.do_not_specialize,
                "do_not_specialize_on_alignment": kernel.do_not_specialize_on_alignment}
    names = kernel.arg_names

    def indices(items):
        return {i if isinstance(i, int) else names.index(i) for i in items or ()}
    return (indices(opts.get("do_not_specialize")),
            indices(opts.get("do_not_specialize_on_alignment")))


def _items(d: dict) -> tuple:
    return tuple(sorted(d.items()))


def config_label(c) -> str:
    kw = c.kwargs
    return f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} w{c.num_warps} s{c.num_stages}"


@contextlib.contextmanager
def recording(arch):
    """Inside: launches of ``ocpmx.native`` are recorded for ``arch`` (see the module doc)."""
    from ..native import dispatch, gemm, launch, tuning

    rec = Recorder(arch)
    real_pick = dispatch.pick_backend

    def pick_backend(device, backend):
        return "triton" if backend in (None, "triton") else real_pick(device, backend)

    def nvidia(device):
        return arch.vendor == "nvidia"

    def hopper(device):
        return arch.name in ("sm_90", "sm_90a")

    def blackwell(device):
        return arch.name in ("sm_100", "sm_100a")

    def gfx950(device):
        return arch.name == "gfx950"

    patches = [(launch, "run", rec.run), (gemm, "has_mx_units", lambda device: True),
               (gemm, "_smem_limit", lambda t: arch.lds_limit)]
    # dispatch's functions wherever a module of ocpmx.native imported them by name
    for m in [m for name, m in sys.modules.items() if name.startswith("ocpmx.native")]:
        patches += [(m, k, v) for k, v in (("pick_backend", pick_backend), ("nvidia", nvidia),
                                           ("hopper", hopper), ("blackwell", blackwell),
                                           ("gfx950", gfx950))
                    if getattr(m, k, None) is getattr(dispatch, k)]
    saved = [(m, k, getattr(m, k)) for m, k, _ in patches]
    env = os.environ.get("TRITON_INTERPRET")
    # the per-device default tiles are cached: an answer for another arch must not carry over
    tuning._device_tuning.cache_clear()
    try:
        os.environ["TRITON_INTERPRET"] = "0"
        for m, k, v in patches:
            setattr(m, k, v)
        yield rec
    finally:
        for m, k, v in saved:
            setattr(m, k, v)
        tuning._device_tuning.cache_clear()
        if env is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = env


@contextlib.contextmanager
def big_tensors(rec: Recorder):
    """Launch sites take their 64-bit-offset (BIG) branch, and the recorder sizes each launch's
    tensors as if its largest held 2^31 elements: the variants such a tensor gets, without
    allocating one."""
    from ..native import launch
    saved = launch.BIG_NUMEL
    launch.BIG_NUMEL, rec.big = 1, True
    try:
        yield
    finally:
        launch.BIG_NUMEL, rec.big = saved, False


# ---------------------------------------------------------------------------------------------
# The workload: calls through the public API, each a (label, thunk) pair.

def _x(shape, dtype):
    return torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dtype)


def _dt(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _quantize_calls(fmts, rules, roundings, rotations, dtypes, axes, shape=(64, 256),
                    block_size=32):
    from .. import native
    out = []
    for fmt, rule, rnd, rot, dt, axis in itertools.product(fmts, rules, roundings, rotations,
                                                           dtypes, axes):
        if rot != "none" and block_size % int(rot.split(":")[0][-2:]):
            continue
        kw = dict(axis=axis, scale_rule=rule, rounding=rnd, rotation=rot, seed=5,
                  block_size=block_size)
        label = (f"{fmt} {rule} {rnd} {rot} {_dt(dt)} axis={axis} shape={shape}"
                 + (f" block={block_size}" if block_size != 32 else ""))
        x = _x(shape, dt)
        out.append((f"quantize({label})", lambda x=x, fmt=fmt, kw=kw: native.quantize(x, fmt, **kw)))
        if fmt != "int8" or block_size == 32:
            out.append((f"quantize_dequantize({label})",
                        lambda x=x, fmt=fmt, kw=kw: native.quantize_dequantize(x, fmt, **kw)))
    return out


def _column_kernel_calls(fmts, roundings, rotations, tile=None):
    """Axis-0 quantizes through the one-pass column kernel (``Tuning(columns="kernel")``;
    the GPU default transposes, then runs the row kernel), with the column tile ``tile``
    (None: the GPU default's) for quantize and quantize-dequantize alike."""
    from .. import native
    from ..native.tuning import GPU
    tuning = dataclasses.replace(GPU, columns="kernel")
    if tile is not None:
        tuning = dataclasses.replace(tuning, cols32=tile, columns_qdq="kernel", cols32_qdq=tile)
    out = []
    for fmt, rnd, rot, qdq in itertools.product(fmts, roundings, rotations, (False, True)):
        fn = native.quantize_dequantize if qdq else native.quantize
        out.append((f"{fn.__name__}({fmt} even {rnd} {rot} bfloat16 axis=0 shape=(256, 128), "
                    f"column kernel{f' {tile}' if tile is not None else ''})",
                    lambda fn=fn, fmt=fmt, rnd=rnd, rot=rot: fn(
                        _x((256, 128), torch.bfloat16), fmt, axis=0, scale_rule="even",
                        rounding=rnd, rotation=rot, seed=5, tuning=tuning)))
    return out


def _gfx950_calls(fmts, roundings, dtypes, shape=(64, 256), hardware=True):
    """quantize(..., conversion='gfx950'): the cases gfx950's instructions convert
    (``hardware``), or every case (the rest in software, as on other chips)."""
    from ..native import quantize
    out = []
    for fmt, rnd, dt in itertools.product(fmts, roundings, dtypes):
        if hardware and rnd == "stochastic" and dt != torch.float32:
            continue  # the hardware path converts stochastically from float32 only
        for axis in (-1, 0):
            out.append((f"quantize {fmt} conversion=gfx950 {rnd} {_dt(dt)} axis={axis}",
                        lambda fmt=fmt, rnd=rnd, dt=dt, axis=axis: quantize(
                            _x(shape, dt), fmt, axis=axis, rounding=rnd, scale_rule="even",
                            seed=5, conversion="gfx950")))
    return out


def _fold_calls(fmts, groups):
    """The FP4/FP6 -> E4M3 fold (issue 17). Its FP8 GEMM of folded operands is left out: it is
    Hopper's path (no MX units); on gfx950 and sm_100a the MX GEMM runs natively."""
    from .. import native
    from ..native import fold
    out = []
    for fmt, group in itertools.product(fmts, groups):
        out.append((f"fold({fmt}, group={group})",
                    lambda fmt=fmt, group=group: fold.fold(
                        native.quantize(_x((128, 512), torch.bfloat16), fmt), group)))
    return out


def _both_axes_calls(fmts, dtypes, rules=("even",), shape=(64, 256)):
    """Quantize-dequantize along both axes in one pass (``kernels.both_axes``)."""
    from .. import native
    return [(f"quantize_dequantize_both_axes({fmt} {rule} {_dt(dt)} {shape})",
             lambda x=_x(shape, dt), fmt=fmt, rule=rule:
             native.quantize_dequantize_both_axes(x, fmt, scale_rule=rule))
            for fmt, rule, dt in itertools.product(fmts, rules, dtypes)]


def _columns_both_axes_calls(fmts, rotations, shape=(64, 96), blocks=1):
    """Quantize and quantize-dequantize along axis 0 through the both-axes module's axis-0
    kernel (``Tuning(columns='both_axes', columns_qdq='both_axes')``; 96 columns: a masked
    program); ``blocks`` > 1: quantize alone, that many blocks along axis 0 a program
    (``Tuning.both_axes_blocks``)."""
    from .. import native
    from ..native.tuning import GPU
    tuning = dataclasses.replace(GPU, columns="both_axes", columns_qdq="both_axes",
                                 both_axes_blocks=blocks)
    ops = (native.quantize,) if blocks > 1 else (native.quantize, native.quantize_dequantize)
    per = f", {blocks} blocks a program" if blocks > 1 else ""
    return [(f"{op.__name__}({fmt} even {rot} bfloat16 axis=0 shape={shape}, "
             f"both-axes module's axis-0 kernel{per})",
             lambda x=_x(shape, torch.bfloat16), fmt=fmt, rot=rot, op=op:
             op(x, fmt, axis=0, scale_rule="even", rotation=rot, tuning=tuning))
            for op, fmt, rot in itertools.product(ops, fmts, rotations)]


def _cast_calls(fmts, roundings, dtypes):
    from .. import native
    return [(f"cast({fmt} {rnd} {_dt(dt)})",
             lambda x=_x((8, 100), dt), fmt=fmt, rnd=rnd: native.cast(x, fmt, rounding=rnd, seed=3))
            for fmt, rnd, dt in itertools.product(fmts, roundings, dtypes)]


def _dequantize_calls(fmts, out_dtypes, block_sizes=(32,), shape=(64, 256)):
    from .. import native
    out = []
    for fmt, dt, bs in itertools.product(fmts, out_dtypes, block_sizes):
        def call(fmt=fmt, dt=dt, bs=bs):
            mx = native.quantize(_x(shape, torch.float32), fmt, block_size=bs)
            return native.dequantize(mx, dt)
        out.append((f"dequantize({fmt} -> {_dt(dt)} block={bs})", call))
    return out


def _matmul_calls(pairs, out_dtypes, tune=True, mnk=(128, 256, 512)):
    from .. import native
    m, n, k = mnk
    out = []
    for (fa, fb), dt in itertools.product(pairs, out_dtypes):
        def call(fa=fa, fb=fb, dt=dt):
            a = native.quantize(_x((m, k), torch.bfloat16), fa)
            b = native.quantize(_x((n, k), torch.bfloat16), fb)
            return native.mx_matmul(a, b, out_dtype=dt, method="dot_scaled", tune=tune)
        out.append((f"mx_matmul({fa} x {fb} -> {_dt(dt)}, tune={tune})", call))
    return out


def _mxlinear_calls(recipes, x_dtypes):
    from .. import native
    out = []
    for name, dt in itertools.product(recipes, x_dtypes):
        def call(name=name, dt=dt):
            layer = native.MXLinear(256, 128, recipe=name, seed=1)
            layer.set_step(3)
            x = _x((2, 32, 256), dt).requires_grad_()
            layer(x).float().sum().backward()
        out.append((f"MXLinear(recipe={name}, x {_dt(dt)}) forward + backward", call))
    return out


def full_workload(arch=None) -> list:
    """Every format, scale rule, rounding, rotation, input dtype and axis; each varied over a
    base product (format x rotation x rounding) rather than all combined; on gfx950 also the
    hardware-conversion quantize."""
    from ..native import RECIPES
    bf16 = (torch.bfloat16,)
    calls = []
    # the base: every format with every rotation and rounding, bf16, along both axes
    calls += _quantize_calls(ALL_FORMATS, ("even",), ("rne", "stochastic"), ROTATIONS, bf16, (-1, 0))
    # input dtypes (the row kernel folds H16's 1/4 for 16-bit inputs only)
    calls += _quantize_calls(ALL_FORMATS, ("even",), ("rne", "stochastic"), ("none", "hadamard16"),
                             (torch.float32, torch.float16), (-1, 0))
    calls += _quantize_calls(ALL_FORMATS, SCALE_RULES, ("rne",), ("none",), bf16, (-1,))
    # tiles that do not divide the tensor (EVEN off), other block sizes, a middle axis
    for axis, shape in ((-1, (3, 96)), (0, (96, 3))):
        calls += _quantize_calls(ALL_FORMATS, ("floor",), ("rne", "stochastic"),
                                 ("none", "hadamard32"), bf16, (axis,), shape=shape)
    calls += _quantize_calls(("e2m1", "e4m3", "int8"), ("floor",), ("rne", "stochastic"),
                             ("none", "hadamard16"), (torch.float32,), (-1, 0), block_size=16)
    calls += _quantize_calls(("e2m1", "e4m3"), ("floor",), ("rne",), ("none", "hadamard32"),
                             bf16, (-1,), block_size=64)
    calls += _quantize_calls(("e2m1", "e5m2"), ("floor",), ("rne", "stochastic"), ("hadamard16",),
                             bf16, (1,), shape=(4, 64, 48))
    calls += _column_kernel_calls(ALL_FORMATS, ("rne", "stochastic"), ("none", "hadamard16"))
    # the quarters tiles (the H200's): four joint serial blocks as a loop, and one block
    from ..native.tuning import H200, ColumnTile
    for tile in (H200.cols32, ColumnTile(64, 2, kb_fast=True, const_stride=True, quarters=True)):
        calls += _column_kernel_calls(("e2m1", "e4m3"), ("rne", "stochastic"),
                                      ("none", "hadamard16"), tile)
    calls += _cast_calls(ALL_FORMATS, ("rne", "stochastic"), DTYPES)
    calls += _dequantize_calls(ALL_FORMATS, (torch.float32, torch.bfloat16), (32, 16))
    calls += _dequantize_calls(ALL_FORMATS, (torch.float32, torch.bfloat16), shape=(3, 96))
    pairs = list(itertools.product(GEMM_FORMATS, GEMM_FORMATS))
    calls += _matmul_calls(pairs, (torch.float32, torch.bfloat16))
    calls += _matmul_calls(pairs, (torch.float32,), tune=False)
    calls += _matmul_calls([("e2m1", "e2m1"), ("e4m3", "e2m1")], (torch.float32,),
                           mnk=(100, 72, 544))  # M and N not multiples of 16
    calls += _fold_calls(("e2m1", "e2m3", "e3m2"), (4, 16))
    float_formats = [f for f in ALL_FORMATS if f != "int8"]
    calls += _both_axes_calls(float_formats, DTYPES)
    calls += _both_axes_calls(("e2m1",), (torch.bfloat16,), SCALE_RULES, shape=(64, 96))
    calls += _columns_both_axes_calls(("e2m1", "e4m3"), (None, "hadamard16"))
    calls += _columns_both_axes_calls(("e2m1", "e4m3"), (None, "hadamard16"), shape=(128, 96),
                                      blocks=2)
    mx_recipes = [r.name for r in RECIPES.values() if r.uses_mx]
    calls += _mxlinear_calls(mx_recipes, (torch.bfloat16, torch.float32))
    # tensors of 2^31 elements and more (64-bit offsets)
    big = _quantize_calls(("e2m1", "e4m3"), ("even",), ("rne", "stochastic"),
                          ("none", "hadamard16"), bf16, (-1, 0))
    big += _dequantize_calls(("e2m1", "e4m3"), (torch.float32, torch.bfloat16))
    big += _both_axes_calls(("e2m1",), (torch.bfloat16,))
    big += _columns_both_axes_calls(("e2m1",), (None,))
    calls += [(f"{label} [BIG]", fn, True) for label, fn in big]
    # conversion='gfx950': on gfx950 its instructions, and for what they lack in the kernel (FP6,
    # stochastic from 16-bit sources) the software conversion, which every other chip runs
    calls += _gfx950_calls(("e2m1", "e2m3", "e3m2", "e4m3", "e5m2"), ("rne", "stochastic"),
                           DTYPES, hardware=False)
    return calls


def subset_workload(arch=None) -> list:
    """A fast subset for CI: one variant of each kernel family and the GEMM configs of
    e2m1 x e2m1 and e4m3 x e4m3 (where gfx950 prunes one); on gfx950 the hardware-conversion
    quantize of FP4 (RNE, bf16) and FP8 (stochastic)."""
    extra = []
    if arch is not None and arch.name == "gfx950":
        extra = (_gfx950_calls(("e2m1",), ("rne",), (torch.bfloat16,))[:1]
                 + _gfx950_calls(("e4m3",), ("stochastic",), (torch.float32,))[:1])
    return extra + [
        *_quantize_calls(("e2m1",), ("even",), ("rne",), ("hadamard16",), (torch.bfloat16,), (-1,)),
        *_quantize_calls(("e4m3",), ("floor",), ("stochastic",), ("random_sign16:7",),
                         (torch.float32,), (0,))[:1],
        *_cast_calls(("e5m2",), ("stochastic",), (torch.float16,)),
        *_dequantize_calls(("e2m1",), (torch.bfloat16,)),
        *_matmul_calls([("e2m1", "e2m1"), ("e4m3", "e4m3")], (torch.float32,)),
    ]


def record(arch, workload, extra=None) -> tuple[list[Launch], list[str]]:
    """(launches in the order first seen, each variant once; errors of workload calls).
    ``workload``: (label, call) or (label, call, big) items; ``extra``: a function called
    inside the recording after the workload (tests plant launches through it)."""
    errors = []
    with recording(arch) as rec:
        for label, fn, *big in workload:
            rec.origin = label
            try:
                with big_tensors(rec) if big and big[0] else contextlib.nullcontext():
                    fn()
            except Exception as e:  # a call the API refuses is reported, not fatal
                errors.append(f"{label}: {type(e).__name__}: {e}")
        if extra is not None:
            rec.origin = "planted"
            extra()
    seen, out = set(), []
    for launch in rec.launches:
        if launch not in seen:
            seen.add(launch)
            out.append(launch)
    return out, errors

"""Per-call plans: the host path of a repeated ``quantize``, ``quantize_dequantize``,
``quantize_dequantize_both_axes`` or ``fold.quantize_folded`` call.

A training step makes the same calls on the same shapes every step. Without a plan each call
parses its arguments, picks the backend, the tuning and the kernel, and builds ~45 kernel
arguments and the fast launch's specialization key (``ops``, ``launch``, ``fastlaunch``): about
60 us of host time a call on an H100 host (``gpu_bench.py --sections host``), more than the GPU
takes to quantize a small model's activations.

The first call of a combination goes that whole way. A combination is the operation, its
arguments as passed (format, axis, block size, scale rule, rounding, rotation, INT8 minimum,
backend, tuning, conversion; keys or a seed) and the input's dtype, shape, device and 16-byte
alignment. Where that call was one launch of a 32-block kernel (``launch.Kernel32``),
after a tiled transpose or not (a column path of 'transpose': the plan then transposes each
call's input the same way first, ``launch.move_axis_last``), and the launch returned a
compiled kernel (``fastlaunch``), it leaves a ``Plan``: the launch, the outputs' shapes, and
the compiled kernel for each specialization of the per-call arguments (the outputs'
alignment, the seed's or the keys', the current device). A later call of the same
combination allocates the outputs, puts the input, the outputs and the random arguments in
place and calls the compiled kernel. ``quantize_dequantize_both_axes`` (and its custom op)
leaves a ``BothAxesPlan`` the same way where its call was the one-pass kernel's launch, and
``quantize_folded`` (and its custom op) a ``FoldPlan``, whose outputs are the folded
operand's (codes, MX scales, group exponents, 2^R, the zeroed stats) and whose kernel adds to
the device's running count of rounded elements; where its fold does not fit the quantize pass
(``fold.fused_in_quantize``), a ``TwoPassFoldPlan``: its quantize's plan, then the fold of the
stored codes with the call's arguments bound. The whole-row fold of stored codes
(``fold.fold_kmajor`` with one group a row: the second pass of ``quantize_folded`` for the
rowwise GEMM method where its quantize pass cannot fold, ``fold.fused_in_quantize``) leaves a
``RowFoldPlan``: its two launches, its caller allocating the
outputs.

Only a contiguous ``torch.Tensor`` on a device of ``DEVICE_TYPES`` (CUDA/ROCm), with
``fastlaunch`` on and outside ``torch.compile``, takes a plan. A call of another kind (the
strided kernel, the emulator, gfx950's conversions), and any launch that
did not return a compiled kernel (the interpreter, a recorder patched into ``launch.run``),
leaves none and goes the whole way every time. The bits are the kernel's either way
(``tests/test_plans.py`` drives the plan path through the interpreter with a stand-in for the
compiled kernel; on a GPU it compares calls with and without plans).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import fastlaunch, launch
from .launch import Kernel32

DEVICE_TYPES = ("cuda",)
_UNSEEN = (None, False)  # a plan's entry for a specialization it has no compiled kernel for
MAX_PLANS = 4096  # far more combinations than a training run makes; past it, start afresh


@dataclass
class Stats:
    """Counts since import (or ``clear``): plans ``made``, calls they served (``hits``; a
    two-pass fold counts its quantize's and its row fold's plans, each)."""
    made: int = 0
    hits: int = 0


STATS = Stats()
PLANS: dict = {}
_PLAIN = (torch.Tensor, torch.nn.Parameter)  # (other subclasses go the whole way)
_RUN = launch.run


def clear() -> None:
    """Forget every plan and reset the counts."""
    PLANS.clear()
    STATS.made = STATS.hits = 0


def current_device() -> int:
    """The current CUDA device's index: where Triton compiled and launches."""
    return torch._C._cuda_getDevice()


def current_stream(device: int):
    """The raw current stream of CUDA device ``device``."""
    return torch._C._cuda_getCurrentRawStream(device)


def key(op: str, x, args: tuple, keys) -> tuple | None:
    """The combination of a call (see the module doc), or None where the call takes no plan.
    ``args``: the operation's arguments as passed, other than ``x``, ``seed`` and ``keys``;
    their types too (``32.0 == 32``, and only the whole way tells them apart: by an error).
    None also where ``launch.run`` is not the package's own (a recorder patched in: it sees
    every launch)."""
    if type(x) not in _PLAIN or not fastlaunch.ENABLED or launch.run is not _RUN or \
            torch.compiler.is_compiling():
        return None
    device = x.device
    if device.type not in DEVICE_TYPES or not x.is_contiguous():
        return None
    return (op, args, tuple(map(type, args)), keys is None, x.dtype, x.shape, device,
            x.data_ptr() & 15)


def find(k: tuple | None) -> Plan | None:
    """The plan of combination ``k``, if one was made."""
    if k is None:
        return None
    try:
        return PLANS.get(k)
    except TypeError:  # an unhashable argument: no plan (the whole way names what is wrong)
        return None


def make(k: tuple | None, done, qdq: bool, data_shape: tuple, scales_shape: tuple,
         n: launch.Numerics, seed: int, keys, result) -> None:
    """After the whole way: keep a plan for combination ``k`` where the call was one 32-block
    launch (``done``: what ``launch.rows32`` returned) that returned a compiled kernel. The
    other arguments: as ``Plan``'s, and the call's seed and keys."""
    if k is None or done is None:
        return
    k32, args, launched, move = done
    plan = Plan(k32, qdq, data_shape, scales_shape, n, result, move)
    dyn = specialization(launch.random_args(n, seed, keys, addresses=True), keys, args[1],
                         args[2], current_device())
    if remember(plan, dyn, args, launched):
        _keep(k, plan)


def as_launched(data: torch.Tensor, scales: torch.Tensor) -> tuple:
    """A quantize plan's ``result`` where its caller takes the launch's (data, scales) as they
    are (the custom op; the quantize pass of a two-pass fold)."""
    return data, scales


def _keep(k: tuple, plan) -> None:
    """Keep ``plan`` for combination ``k`` (starting afresh past ``MAX_PLANS``)."""
    try:
        if len(PLANS) >= MAX_PLANS:
            PLANS.clear()
        PLANS[k] = plan
        STATS.made += 1
    except TypeError:  # (an unhashable argument)
        pass


def _grid3(grid: tuple) -> tuple:
    """A launch grid as the three dimensions the compiled kernel's launcher takes."""
    return (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)


class Plan:
    """One combination's launch (``k32``) and outputs: K-major codes of ``data_shape`` and
    scales of ``scales_shape`` (quantize), or bf16 values of ``data_shape``
    (quantize-dequantize, ``qdq``); ``result(data, scales)`` is what the operation returns;
    ``numerics``: the call's (its random arguments come from them where no keys are passed);
    ``move``: None, or the arguments (axis, tuning) of the transpose
    (``launch.move_axis_last``) that went before the kernel in the first call (a column path
    of ``tuning.column_path`` 'transpose'): each call transposes its input the same way."""

    __slots__ = ("k32", "qdq", "data_shape", "scales_shape", "numerics", "result", "grid",
                 "tail", "compiled", "move")

    def __init__(self, k32: Kernel32, qdq: bool, data_shape: tuple, scales_shape: tuple,
                 numerics: launch.Numerics, result, move: tuple | None = None):
        self.k32, self.qdq = k32, qdq
        self.data_shape, self.scales_shape = data_shape, scales_shape
        self.numerics, self.result = numerics, result
        self.grid = _grid3(k32.grid)
        self.tail = None      # the bound constexprs and defaults after the positional arguments
        self.compiled = {}    # per-call specialization -> (compiled kernel, takes addresses)
        self.move = move

    def kernel_input(self, x: torch.Tensor) -> torch.Tensor:
        """The input the kernel reads: ``x``, or its transpose (``move``)."""
        return x if self.move is None else launch.move_axis_last(x.detach(), *self.move)

    def outputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh (data, scales) on ``x``'s device as the kernel takes them
        (quantize-dequantize: the bf16 output as int32 pairs, and itself)."""
        if self.qdq:
            out = x.new_empty(self.data_shape, dtype=torch.bfloat16)
            return out.view(torch.int32), out
        return (x.new_empty(self.data_shape, dtype=torch.uint8),
                x.new_empty(self.scales_shape, dtype=torch.uint8))


def specialization(random: tuple, keys, data: torch.Tensor, scales: torch.Tensor,
                   device: int) -> tuple:
    """What a compiled kernel is specialized on that the combination does not fix: the seed
    and sign arguments' specializations (``random``: the integers ``launch.random_args``
    gives where no keys are passed, ``fastlaunch.arg_key``'s; or the keys tensor's alignment
    and stride, which fix those of its two elements), the outputs' alignment, and the current
    device."""
    return _random_spec(random, keys), data.data_ptr() & 15, scales.data_ptr() & 15, device


def _random_spec(random: tuple, keys) -> tuple:
    """The seed and sign arguments' part of ``specialization``."""
    if keys is None:
        return fastlaunch.arg_key(random[0]), fastlaunch.arg_key(random[1])
    return keys.data_ptr() & 15, keys.stride(0)


def remember(plan: Plan, dyn: tuple, args: tuple, launched) -> bool:
    """Keep the compiled kernel ``launched`` (what ``run`` returned) in ``plan`` for
    specialization ``dyn``; False where it is none or cannot be called directly."""
    if not fastlaunch.compiled(launched):
        return False
    if plan.tail is None:
        plan.tail = fastlaunch.cached_tail(plan.k32.kernel, args, plan.k32.consts)
        if plan.tail is None:
            return False
    plan.compiled[dyn] = (launched, fastlaunch.takes_addresses(launched))
    return True


def run(plan: Plan, x: torch.Tensor, seed: int, keys):
    """The operation on ``x`` through ``plan``: what the call it was made from returns.

    A compiled kernel that takes addresses (``fastlaunch.takes_addresses``: Triton's) gets the
    tensors' addresses as integers, which its launcher passes on unchecked; given tensors, it
    calls each one's ``data_ptr`` and asks the driver whether the pointer is a device's
    (``cuPointerGetAttribute``), seven times a launch. The plan's tensors are known: the input
    (a contiguous tensor on the combination's device), the outputs it allocated, the keys."""
    x = plan.kernel_input(x)
    data, scales = plan.outputs(x)
    device = current_device()
    random = launch.random_args(plan.numerics, seed, keys, addresses=True)
    dyn = specialization(random, keys, data, scales, device)
    kernel, addresses = plan.compiled.get(dyn, _UNSEEN)
    if addresses:
        args = plan.k32.args(x.data_ptr(), data.data_ptr(), scales.data_ptr(), *random)
    else:
        if x.requires_grad:
            x = x.detach()
        args = plan.k32.args(x, data, scales, *launch.random_args(plan.numerics, seed, keys))
    if kernel is None:  # a specialization not seen yet: through ``run``, then kept
        remember(plan, dyn, args, plan.k32.launch(args))
    else:
        fastlaunch.call(kernel, plan.grid, (*args, *plan.tail), current_stream(device))
        STATS.hits += 1
    return plan.result(data, scales)


class FoldPlan:
    """A ``quantize_folded`` combination's launch (``native.fold``): the 32-block kernel of its
    first call (``k32``, after the transpose ``move`` where that call transposed) writing
    E4M3 codes (rows, K), MX scales (rows, K / 32), group exponents (rows, K / (32 group)),
    with ``pow2`` 2^R group-major, and the fold's stats (zeroed each call) and the device's
    running count of rounded elements (``total``, one tensor for the device's life);
    ``result(codes, exponents, scales, stats, pow2)`` is what the call returns."""

    __slots__ = ("k32", "move", "rows", "k", "group", "pow2", "total", "numerics", "result",
                 "grid", "tail", "compiled")

    def __init__(self, k32: Kernel32, move, rows: int, k: int, group: int, pow2: bool,
                 total: torch.Tensor, numerics: launch.Numerics, result):
        self.k32, self.move = k32, move
        self.rows, self.k, self.group, self.pow2, self.total = rows, k, group, pow2, total
        self.numerics, self.result = numerics, result
        self.grid = _grid3(k32.grid)
        self.tail = None
        self.compiled = {}

    kernel_input = Plan.kernel_input

    def outputs(self, x: torch.Tensor) -> tuple:
        """Fresh (codes, scales, exponents, 2^R or None, zeroed stats) on ``x``'s device."""
        rows, k, nblk = self.rows, self.k, self.k // 32
        return (x.new_empty((rows, k), dtype=torch.uint8),
                x.new_empty((rows, nblk), dtype=torch.uint8),
                x.new_empty((rows, nblk // self.group), dtype=torch.int32),
                x.new_empty((nblk // self.group, rows), dtype=torch.float32) if self.pow2
                else None,
                x.new_zeros(2, dtype=torch.int64))


def make_fold(k: tuple | None, done, out: launch.FoldOutput, k_len: int, n: launch.Numerics,
              seed: int, keys, result) -> None:
    """After ``quantize_folded``'s whole way: keep a ``FoldPlan`` for combination ``k`` where
    the call was one 32-block launch (after a transpose or not: ``done`` as ``make``'s) that
    returned a compiled kernel; ``out``: the call's fold outputs."""
    if k is None or done is None:
        return
    k32, args, launched, move = done
    plan = FoldPlan(k32, move, out.rows, k_len, out.group, out.pow2 is not None, out.total, n,
                    result)
    dyn = _fold_specialization(launch.random_args(n, seed, keys, addresses=True), keys,
                               (args[1], args[2], *out.args()[:3]), current_device())
    if remember(plan, dyn, args, launched):
        _keep(k, plan)


def _fold_specialization(random: tuple, keys, outs: tuple, device: int) -> tuple:
    """``specialization`` for a fold: every output's alignment (the row kernel's 2^R argument
    is the exponents where no 2^R is asked)."""
    return _random_spec(random, keys), tuple(t.data_ptr() & 15 for t in outs), device


class TwoPassFoldPlan:
    """A repeated ``quantize_folded`` call whose fold does not fit its quantize pass
    (``fold.fused_in_quantize``; whole rows along tokens, for one): the plan of its quantize
    launch (``quantize``, made under its own combination), then ``fold(codes, scales)``, the
    fold of the stored codes with the call's bound arguments (the whole-row fold takes its
    ``RowFoldPlan``); ``result`` as ``FoldPlan``'s. What it skips is the whole way's argument
    parsing, backend and tuning choice and both combinations' keys."""

    __slots__ = ("quantize", "fold", "result")

    def __init__(self, quantize: Plan, fold, result):
        self.quantize, self.fold, self.result = quantize, fold, result


def make_two_pass_fold(k: tuple | None, quantize_key: tuple | None, fold, result) -> None:
    """After ``quantize_folded``'s whole way through quantize, then fold: keep a
    ``TwoPassFoldPlan`` for combination ``k`` where its quantize left a plan (under
    ``quantize_key``)."""
    quantize = find(quantize_key)
    if k is not None and quantize is not None:
        _keep(k, TwoPassFoldPlan(quantize, fold, result))


def run_fold(plan: FoldPlan | TwoPassFoldPlan, x: torch.Tensor, seed: int, keys):
    """``quantize_folded`` on ``x`` through ``plan`` (as ``run``)."""
    if type(plan) is TwoPassFoldPlan:
        f = plan.fold(*run(plan.quantize, x, seed, keys))
        return plan.result(f.codes, f.exponents, f.scales, f.stats, f.pow2)
    x = plan.kernel_input(x)
    codes, scales, exps, p2, stats = plan.outputs(x)
    outs = (exps, p2 if p2 is not None else exps, stats, plan.total)
    device = current_device()
    random = launch.random_args(plan.numerics, seed, keys, addresses=True)
    dyn = _fold_specialization(random, keys, (codes, scales, *outs[:3]), device)
    kernel, addresses = plan.compiled.get(dyn, _UNSEEN)
    k32 = plan.k32
    if addresses:
        args = k32.args_with(x.data_ptr(), codes.data_ptr(), scales.data_ptr(), *random,
                             tuple(t.data_ptr() for t in outs))
    else:
        if x.requires_grad:
            x = x.detach()
        args = k32.args_with(x, codes, scales,
                             *launch.random_args(plan.numerics, seed, keys), outs)
    if kernel is None:
        remember(plan, dyn, args, k32.launch(args))
    else:
        fastlaunch.call(kernel, plan.grid, (*args, *plan.tail), current_stream(device))
        STATS.hits += 1
    return plan.result(codes, exps, scales, stats, p2)


class RowFoldPlan:
    """A repeated whole-row fold's two launches (``fold._fold_rows``: ``fold_rows_kernel``, then
    ``fold_rows_finish_kernel``): each one's grid and bound constexprs (``tail``), and for each
    specialization of the per-call arguments (every tensor's alignment, the current device)
    both compiled kernels and whether each takes addresses."""

    __slots__ = ("grids", "tails", "compiled")

    def __init__(self, grids: tuple, tails: tuple):
        self.grids, self.tails = tuple(map(_grid3, grids)), tails
        self.compiled = {}


def _row_fold_dyn(second: tuple, device: int) -> tuple:
    """A whole-row fold's specialization: the alignment of every tensor its second launch
    takes (a superset of the first's), and the current device."""
    return tuple(a.data_ptr() & 15 for a in second if isinstance(a, torch.Tensor)), device


def _as_addresses(args: tuple) -> tuple:
    return tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)


def run_row_fold(plan: RowFoldPlan | None, first: tuple, second: tuple) -> bool:
    """The two launches of a whole-row fold through ``plan`` on the positional arguments
    ``first`` and ``second`` (``fold._fold_rows``'s); False, launching nothing, where there is
    no plan or it has no compiled kernels for these arguments' specialization."""
    if plan is None:
        return False
    device = current_device()
    entry = plan.compiled.get(_row_fold_dyn(second, device))
    if entry is None:
        return False
    stream = current_stream(device)
    for (kernel, addresses), grid, args, tail in zip(entry, plan.grids, (first, second),
                                                     plan.tails):
        fastlaunch.call(kernel, grid, (*(_as_addresses(args) if addresses else args), *tail),
                        stream)
    STATS.hits += 1
    return True


def make_row_fold(k: tuple | None, launches: list) -> None:
    """After a whole-row fold's whole way: keep its launches for combination ``k`` where both
    returned a compiled kernel (``launches``: (kernel, grid, positional arguments,
    constexprs, what ``launch.run`` returned) for each, in order); a new specialization of a
    combination already planned joins its plan."""
    if k is None or not all(fastlaunch.compiled(done) for *_, done in launches):
        return
    plan = find(k)
    if plan is None:
        tails = tuple(fastlaunch.cached_tail(kernel, args, kw) for kernel, _, args, kw, _ in
                      launches)
        if None in tails:
            return
        plan = RowFoldPlan(tuple(grid for _, grid, *_ in launches), tails)
        _keep(k, plan)
    plan.compiled[_row_fold_dyn(launches[-1][2], current_device())] = tuple(
        (done, fastlaunch.takes_addresses(done)) for *_, done in launches)


class BothAxesPlan:
    """A repeated ``quantize_dequantize_both_axes`` call's launch: one
    ``kernels.both_axes.qdq_both_axes_kernel`` launch on a matrix of ``shape`` (``grid``, the
    rotation's scale ``rot_scale``, the constexprs ``consts`` and, bound in order, ``tail``),
    and the compiled kernel (and whether it takes addresses) for each specialization of the
    per-call arguments (the outputs' alignment, the current device)."""

    __slots__ = ("shape", "grid", "rot_scale", "consts", "tail", "compiled")

    def __init__(self, shape: tuple, grid: tuple, rot_scale: float, consts: dict, tail: tuple):
        self.shape, self.rot_scale, self.consts, self.tail = shape, rot_scale, consts, tail
        self.grid = _grid3(grid)
        self.compiled = {}


def _both_axes_kernel():
    return launch.kernels.both_axes.qdq_both_axes_kernel


def _both_axes_dyn(rows: torch.Tensor, cols: torch.Tensor, device: int) -> tuple:
    return rows.data_ptr() & 15, cols.data_ptr() & 15, device


def make_both_axes(k: tuple | None, rows: torch.Tensor, cols: torch.Tensor, done: tuple,
                   rot_scale: float) -> None:
    """After the whole way of a ``quantize_dequantize_both_axes`` call that wrote ``rows`` and
    ``cols``: keep a plan for combination ``k`` where its launch (``done``: what
    ``launch.qdq_both_axes`` returned) returned a compiled kernel. ``rot_scale``: the call's
    (``Numerics.rot_scale``)."""
    if k is None:
        return
    grid, args, consts, launched = done
    if not fastlaunch.compiled(launched):
        return
    tail = fastlaunch.cached_tail(_both_axes_kernel(), args, consts)
    if tail is None:
        return
    plan = BothAxesPlan(tuple(rows.shape), grid, rot_scale, consts, tail)
    plan.compiled[_both_axes_dyn(rows, cols, current_device())] = \
        (launched, fastlaunch.takes_addresses(launched))
    _keep(k, plan)


def run_both_axes(plan: BothAxesPlan, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The one-pass kernel's (values along the last axis, values along axis 0 K-major: x's
    transpose) of ``x`` through ``plan``: what ``ops.both_axes_impl`` returns."""
    rows = x.new_empty(plan.shape, dtype=torch.bfloat16)
    cols = x.new_empty(plan.shape[::-1], dtype=torch.bfloat16)
    device = current_device()
    dyn = _both_axes_dyn(rows, cols, device)
    kernel, addresses = plan.compiled.get(dyn, _UNSEEN)
    if addresses:  # (as ``run``'s)
        args = launch.both_axes_args(x.data_ptr(), rows.data_ptr(), cols.data_ptr(),
                                     plan.rot_scale, plan.shape)
    else:
        if x.requires_grad:
            x = x.detach()
        args = launch.both_axes_args(x, rows, cols, plan.rot_scale)
    if kernel is None:  # a specialization not seen yet: through ``run``, then kept
        launched = launch.run(_both_axes_kernel(), plan.grid, *args, **plan.consts)
        if fastlaunch.compiled(launched):
            plan.compiled[dyn] = (launched, fastlaunch.takes_addresses(launched))
    else:
        fastlaunch.call(kernel, plan.grid, (*args, *plan.tail), current_stream(device))
        STATS.hits += 1
    return rows, cols

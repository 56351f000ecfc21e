"""``ocpmx.native.plans``: a repeated quantize or quantize-dequantize call takes the launch its
first call left, and must give the bits the whole way gives.

On the CPU the plan path runs through the Triton interpreter: plans are let onto CPU tensors
(``DEVICE_TYPES``) and ``launch.run`` returns a stand-in for Triton's compiled kernel whose
``kernel[grid](*args, *tail)`` runs the interpreter on the arguments the plan puts in place (its
positional arguments and the constexprs it bound: a wrong order or a stale seed changes the
bits). Every result is compared with the emulator. On a GPU the same calls go through real
compiled kernels, compared with calls that take no plan."""
import ctypes
import dataclasses

import pytest
import torch
from triton.runtime.jit import JITFunction

from ocpmx import native
from ocpmx.spec import Rotation
from ocpmx.native import fastlaunch, launch, plans

GPU = torch.cuda.is_available()


class StandIn:
    """What ``launch.run`` returns on the CPU under these tests: a 'compiled kernel' for the
    specialization of the arguments it was first launched with, whose launch checks that the
    arguments given have that specialization (as Triton's compiled kernel assumes) and runs the
    interpreter on every positional argument given. Like Triton's, it has a launcher
    (``run``, what ``fastlaunch.call`` calls) that takes a tensor argument as its address
    too: the tensor is rebuilt there with the first launch's shape, strides and dtype (a wrong
    address or position reads other memory and changes the bits)."""

    def __init__(self, kernel, args):
        self.kernel, self.n = kernel, len(args)
        self.spec = tuple(map(fastlaunch.arg_key, args))
        self.like = tuple((a.shape, a.stride(), a.dtype) if isinstance(a, torch.Tensor)
                          else None for a in args)
        self.function, self.packed_metadata = object(), object()
        self.launches = self.addresses = 0

    def __getitem__(self, grid):
        def runner(*args, stream=None):
            assert stream is None
            assert tuple(map(fastlaunch.arg_key, args[:self.n])) == self.spec, "specialization"
            self.launches += 1
            self.kernel[grid](*args)
        return runner

    def run(self, gx, gy, gz, stream, function, packed, metadata, enter, leave, *args):
        assert (function, packed) == (self.function, self.packed_metadata)
        assert (metadata, enter, leave) == (None, None, None)
        given = [_at(a, like) if like is not None and type(a) is int else a
                 for a, like in zip(args, self.like)]
        self.addresses += sum(a is not g for a, g in zip(args, given))
        self[(gx, gy, gz)](*given, *args[self.n:], stream=stream)


def _at(address: int, like: tuple) -> torch.Tensor:
    """The CPU tensor of (shape, strides, dtype) ``like`` at ``address``."""
    shape, stride, dtype = like
    span = 1 + sum((n - 1) * st for n, st in zip(shape, stride))
    size = span * torch.empty((), dtype=dtype).element_size()
    buf = (ctypes.c_char * size).from_address(address)
    return torch.frombuffer(buf, dtype=dtype).as_strided(shape, stride)


@pytest.fixture
def cpu_plans(monkeypatch):
    """Plans on CPU tensors (the interpreter) with ``StandIn`` kernels."""
    if not native.interpreting():
        pytest.skip("the CPU plan path runs the kernels through the interpreter")
    made = []
    real_run = launch.run

    def run(kernel, grid, *args, **consts):
        real_run(kernel, grid, *args, **consts)
        made.append(StandIn(kernel, args))
        return made[-1]
    monkeypatch.setattr(launch, "run", run)
    monkeypatch.setattr(plans, "_RUN", run)  # (plans stop where another ``run`` is patched in)
    monkeypatch.setattr(plans, "DEVICE_TYPES", ("cpu",))
    monkeypatch.setattr(plans, "current_device", lambda: 0)
    monkeypatch.setattr(plans, "current_stream", lambda device: None)
    monkeypatch.setattr(fastlaunch, "compiled", lambda out: isinstance(out, StandIn))
    monkeypatch.setattr(fastlaunch, "takes_addresses", lambda out: isinstance(out, StandIn))
    sigs = {}

    def signature(kernel):  # (the interpreter's kernels: the signature of the JITFunction)
        if kernel not in sigs:
            fn = kernel
            while hasattr(fn, "fn"):
                fn = fn.fn
            sigs[kernel] = fastlaunch._signature_of(JITFunction(fn))
        return sigs[kernel]
    monkeypatch.setattr(fastlaunch, "signature", signature)
    plans.clear()
    yield made
    plans.clear()


def _reference(x, fmt, qdq, seed=0, keys=None, **kw):
    """The emulator's bits for a call (keys: read on the host, as the emulator backend does)."""
    kw = dict(kw, seed=seed, keys=None if keys is None else keys.cpu())
    kw.pop("backend", None)
    if qdq:
        return native.quantize_dequantize(x.cpu(), fmt, backend="emulator", **kw)
    return native.quantize(x.cpu(), fmt, backend="emulator", **kw)


def _same(got, want, qdq):
    if qdq:
        assert torch.equal(got.cpu().view(torch.int16), want.view(torch.int16))
    else:
        assert torch.equal(got.data.cpu(), want.data) and \
            torch.equal(got.scales_kmajor.cpu(), want.scales_kmajor)
        assert (got.fmt, got.axis, got.shape, got.block_size, got.rotation) == \
            (want.fmt, want.axis, want.shape, want.block_size, want.rotation)


COLUMNS = dataclasses.replace(native.default_tuning(), columns="kernel", columns_qdq="kernel")
# along another axis than the last through a tiled transpose, then the row kernel
TRANSPOSE = dataclasses.replace(native.default_tuning(), columns="transpose",
                                columns_qdq="transpose", columns_fold="transpose")
# along axis 0 through ``kernels.both_axes.columns_kernel`` (the column kernel's arguments)
AXIS0 = dataclasses.replace(native.default_tuning(), columns="both_axes",
                            columns_qdq="both_axes", both_axes=(64, 2))
CASES = [  # (dtype, shape, options)
    (torch.bfloat16, (64, 96), dict()),
    (torch.bfloat16, (64, 96), dict(rotation="hadamard16")),
    (torch.float32, (2, 32, 64), dict(rounding="stochastic")),
    (torch.bfloat16, (64, 96), dict(axis=0, rotation="hadamard16", tuning=COLUMNS)),
    (torch.bfloat16, (64, 48), dict(axis=0, rounding="stochastic", tuning=COLUMNS)),
    (torch.float16, (3, 64, 32), dict(axis=1, scale_rule="rceil", tuning=COLUMNS)),
    (torch.bfloat16, (64, 96), dict(axis=0, rotation="hadamard16", tuning=AXIS0)),
    (torch.float32, (64, 3, 5), dict(axis=0, scale_rule="ceil", tuning=AXIS0)),
    (torch.bfloat16, (64, 96), dict(axis=0, rotation="hadamard16", tuning=TRANSPOSE)),
    (torch.float32, (2, 64, 32), dict(axis=1, rounding="stochastic", tuning=TRANSPOSE)),
]


@pytest.mark.parametrize("qdq", [False, True])
@pytest.mark.parametrize("dtype,shape,kw", CASES)
def test_repeated_calls_take_the_plan_and_keep_the_bits(cpu_plans, qdq, dtype, shape, kw):
    """The first call goes the whole way and leaves a plan; later calls with other data and
    other seeds take it (one launch each, through the stand-in) and give the emulator's
    bits: the seed is read per call, not frozen into the plan."""
    fmt = "e4m3" if qdq else "e2m1"
    op = native.quantize_dequantize if qdq else native.quantize
    g = torch.Generator().manual_seed(0)
    for seed in (0, 5, 6, 2**40 + 3, 2**40 + 5, 1, 1, 16, 2**64 - 1):
        x = (torch.randn(shape, generator=g) * 4).to(dtype)
        got = op(x, fmt, seed=seed, **kw)
        _same(got, _reference(x, fmt, qdq, seed, **kw), qdq)
        assert plans.STATS.made == 1
    # Triton specializes an integer on its equality to 1, divisibility by 16 and width: 0, 5,
    # 2^40 + 3, 1 and 2^64 - 1 each went through ``run`` first; 6, 2^40 + 5, 1 again and 16
    # through the plan's kernel of the same specialization
    assert plans.STATS.hits == 4 and sum(s.launches for s in cpu_plans) == 4
    # (each through the launcher with the seven tensors' addresses: input, codes or values,
    # scales, and the scales again for the fold's four unused outputs)
    assert sum(s.addresses for s in cpu_plans) == 4 * 7
    if kw.get("tuning") is AXIS0:  # (the axis-0 kernel's launch is what the plan keeps)
        assert {s.kernel for s in cpu_plans} == {launch.kernels.both_axes.columns_kernel}
    if kw.get("tuning") is TRANSPOSE:  # (each call transposes through ``launch.run`` first)
        transposes = [s for s in cpu_plans if s.kernel is launch.kernels.transpose.transpose_kernel]
        assert len(transposes) == 9 and all(p.move is not None for p in plans.PLANS.values())


@pytest.mark.parametrize("keys", [False, True])
def test_a_kernel_without_addresses_takes_the_tensors(cpu_plans, monkeypatch, keys):
    """A compiled kernel that does not take addresses (``fastlaunch.takes_addresses``) gets
    the tensors themselves from a plan, with the same bits."""
    monkeypatch.setattr(fastlaunch, "takes_addresses", lambda out: False)
    x = torch.randn(64, 96).bfloat16().requires_grad_()
    kw = dict(rounding="stochastic", rotation="hadamard16")
    for seed in (3, 4, 5):
        k = torch.tensor([seed, 0], dtype=torch.int64) if keys else None
        for qdq in (False, True):
            op = native.quantize_dequantize if qdq else native.quantize
            _same(op(x, "e2m1", seed=seed, keys=k, **kw),
                  _reference(x.detach(), "e2m1", qdq, seed, keys=k, **kw), qdq)
        native.quantize_dequantize_both_axes(x, "e2m1")
    assert plans.STATS.made == 3 and plans.STATS.hits == 6
    assert sum(s.launches for s in cpu_plans) == 6
    assert sum(s.addresses for s in cpu_plans) == 0


def test_keys_are_read_per_call(cpu_plans):
    """With keys (MXLinear's buffer) the plan passes the key tensor itself: new key values give
    new stochastic roundings and signs, the emulator's for those keys."""
    x = torch.randn(64, 64).bfloat16()
    kw = dict(rounding="stochastic", rotation=Rotation(16, mask=0))
    for seed, mask in ((1, 0x5A5A), (2, 0x0F0F), (2, 0x0F0F), (99, 0xFFFF)):
        keys = torch.tensor([seed, mask], dtype=torch.int64)
        for qdq in (False, True):
            op = native.quantize_dequantize if qdq else native.quantize
            _same(op(x, "e2m1", keys=keys, **kw), _reference(x, "e2m1", qdq, keys=keys, **kw),
                  qdq)
    assert plans.STATS.made == 2 and plans.STATS.hits == 6
    assert sum(s.addresses for s in cpu_plans) == 6 * 9  # (the two keys' too)
    with pytest.raises(TypeError, match="keys must be an int64 tensor"):
        native.quantize(x, "e2m1", keys=torch.zeros(2, dtype=torch.int32), **kw)


def test_strided_keys_get_their_own_kernel(cpu_plans):
    """Key tensors whose sign slice sits elsewhere (a strided view) specialize the kernel
    differently from contiguous ones: each gets its own launch first (the stand-in asserts the
    specialization it was made for)."""
    x = torch.randn(64, 64).bfloat16()
    kw = dict(rounding="stochastic", rotation=Rotation(16, mask=0))
    buf = torch.tensor([[7, 0], [0x3C3C, 0]], dtype=torch.int64)
    for keys in (buf[:, 0], buf[:, 0].contiguous(), buf[:, 0], buf[:, 0].contiguous()):
        _same(native.quantize(x, "e2m1", keys=keys, **kw),
              _reference(x, "e2m1", False, keys=keys, **kw), False)
    assert plans.STATS.made == 1 and plans.STATS.hits == 2


def test_arguments_of_another_type_are_checked_the_whole_way(cpu_plans):
    """An argument equal to a planned one but of another type (32.0 for 32) takes no plan:
    the whole way refuses it as it would without any plan."""
    x = torch.randn(32, 64)
    for _ in range(2):
        native.quantize(x, "e2m1", block_size=32, axis=1)
    assert plans.STATS.hits == 1
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        native.quantize(x, "e2m1", block_size=32.0, axis=1)
    with pytest.raises(TypeError):
        native.quantize(x, "e2m1", block_size=32, axis=1.0)


def test_every_argument_is_part_of_the_combination(cpu_plans):
    """A call that differs from a planned one in any argument, or in its input's dtype, shape
    or alignment, does not take that plan: each gives the emulator's bits."""
    base = torch.randn(64 * 64 + 8)
    x = base[:64 * 64].view(64, 64).bfloat16()
    calls = [(x, {}), (x, dict(rotation="hadamard16")), (x, dict(rounding="stochastic")),
             (x, dict(scale_rule="ceil")), (x, dict(axis=0, tuning=COLUMNS)),
             (x, dict(axis=-2, tuning=COLUMNS)), (x.float(), {}), (x[:32].clone(), {}),
             (x.view(32, 128), {}), (base[1:1 + 64 * 64].view(64, 64), {}),
             (base[2:2 + 64 * 64].view(64, 64), {})]  # (4 and 8 bytes off)
    for fmt in ("e2m1", "e3m2"):
        for t, kw in calls + calls:  # the second round: every call planned
            _same(native.quantize(t, fmt, **kw), _reference(t, fmt, False, **kw), False)
    assert plans.STATS.made == 2 * len(calls) and plans.STATS.hits == 2 * len(calls)


def test_no_plan_where_the_call_is_not_one_compiled_launch(cpu_plans, monkeypatch):
    """A non-contiguous input, the strided kernel (blocks of 16), the emulator backend and a
    launch that returned no compiled kernel leave no plan; the results are the emulator's
    still."""
    x = torch.randn(64, 64).bfloat16()
    for t, kw in [(x.t(), {}), (x, dict(block_size=16)), (x, dict(backend="emulator"))]:
        for _ in range(2):
            _same(native.quantize(t, "e2m1", **kw), _reference(t, "e2m1", False, **kw), False)
    assert plans.STATS.made == 0
    monkeypatch.setattr(fastlaunch, "compiled", lambda out: False)
    for _ in range(2):
        native.quantize(x, "e2m1")
    assert plans.STATS.made == 0 and plans.STATS.hits == 0


def test_grad_inputs_and_errors_on_the_plan_path(cpu_plans):
    """An input that requires grad is read, not tracked; bad arguments raise the whole way's
    errors once a plan exists for the good ones."""
    x = torch.randn(32, 64).bfloat16().requires_grad_()
    for _ in range(2):
        y = native.quantize_dequantize(x, "e2m1")
        assert not y.requires_grad
        _same(y, _reference(x.detach(), "e2m1", True), True)
    assert plans.STATS.hits == 1
    with pytest.raises(ValueError, match="not divisible by the block size"):
        native.quantize_dequantize(x[:, :48], "e2m1")
    with pytest.raises(ValueError, match="unknown rotation"):  # (unhashable: no plan lookup)
        native.quantize_dequantize(x, "e2m1", rotation=["hadamard16"])
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        native.quantize(x.double(), "e2m1")


def test_custom_ops_take_plans(cpu_plans):
    """The custom ops' implementations (what a compiled graph calls at run time) make and take
    plans of their own, with the K-major results the ops return, and the emulator's bits."""
    from ocpmx.native import library
    x = torch.randn(64, 96).bfloat16()
    for seed in (3, 4, 5):
        want = _reference(x, "e2m1", False, seed, axis=0, rounding="stochastic",
                          rotation="hadamard16")
        data, scales = library.quantize_op(x, "e2m1", "floor", "stochastic", "hadamard16", -127,
                                           0, 32, seed, None, "", "ocp")
        assert torch.equal(data, want.data) and torch.equal(scales, want.scales_kmajor)
        want = _reference(x, "e2m1", True, seed, rounding="stochastic")
        out = library.quantize_dequantize_op(x, "e2m1", "floor", "stochastic", "none", 1, 32,
                                             seed, None, "", "ocp")
        assert torch.equal(out.view(torch.int16), want.view(torch.int16))
    assert plans.STATS.made == 2 and plans.STATS.hits == 4


# the folds' options: rows, a rotation and 2^R, stochastic rounding with keys, along another
# axis through the transpose or the column kernel, groups of 4 and of the whole row
FOLD_COLUMNS = dataclasses.replace(native.default_tuning(), columns="kernel",
                                   columns_fold="kernel")
FOLD_AXIS0 = dataclasses.replace(native.default_tuning(), columns_fold="both_axes",
                                 fold_columns=(32, 1))  # (kernels.both_axes.columns_fold_kernel)
FOLD_CASES = [
    ("e2m1", torch.bfloat16, (64, 256), dict(group=4)),
    ("e2m1", torch.bfloat16, (64, 256), dict(group=8, pow2=True, rotation="hadamard16")),
    ("e3m2", torch.float32, (2, 32, 128), dict(group=4, rounding="stochastic", keys=True,
                                               rotation=Rotation(16, mask=0))),
    ("e2m1", torch.bfloat16, (128, 64), dict(group=4, axis=0, pow2=True, tuning=TRANSPOSE)),
    ("e2m3", torch.bfloat16, (128, 64), dict(group=4, axis=0, rotation="hadamard16",
                                             tuning=FOLD_COLUMNS)),
    ("e2m1", torch.float32, (256, 40), dict(group=2, axis=0, pow2=True, tuning=FOLD_AXIS0)),
    # whole rows of 64 and 128 blocks: folded in the row kernel's pass (``fused_in_quantize``);
    # of 24, 7 and 48 blocks: a program per row, padded to a power of two (its ROW_NB)
    ("e2m1", torch.bfloat16, (8, 64 * 32), dict(group=64, pow2=True, rotation="hadamard16")),
    ("e3m2", torch.float32, (128 * 32, 8), dict(group=128, axis=0, tuning=TRANSPOSE)),
    ("e2m1", torch.bfloat16, (6, 24 * 32), dict(group=24, pow2=True, rotation="hadamard16")),
    ("e3m2", torch.float32, (2, 3, 7 * 32), dict(group=7, rounding="stochastic", keys=True)),
    ("e2m3", torch.bfloat16, (48 * 32, 4), dict(group=48, axis=0, pow2=True, tuning=TRANSPOSE)),
]


def _same_fold(got, want):
    for name in ("codes", "exponents", "scales", "stats"):
        assert torch.equal(getattr(got, name).cpu(), getattr(want, name).cpu()), name
    assert (got.pow2 is None) == (want.pow2 is None)
    if want.pow2 is not None:
        assert torch.equal(got.pow2.cpu().view(torch.int32), want.pow2.cpu().view(torch.int32))
    assert (got.group, got.fmt) == (want.group, want.fmt)


@pytest.mark.parametrize("fmt,dtype,shape,kw", FOLD_CASES)
def test_repeated_folds_take_the_plan_and_keep_the_bits(cpu_plans, fmt, dtype, shape, kw):
    """``quantize_folded`` (the fold methods' operands, six a layer and step): the first call
    leaves a ``FoldPlan``; later calls with new data, seeds and key values take it and give
    the emulator's codes, exponents, MX scales, stats and 2^R, and add their rounded elements
    to the device's running total as the whole way does."""
    from ocpmx.native import fold
    g = torch.Generator().manual_seed(2)
    kw = dict(kw)
    group, with_keys = kw.pop("group"), kw.pop("keys", False)
    rounded = expected = 0
    for i, seed in enumerate((0, 5, 6, 2**40 + 3, 2**40 + 5, 7)):
        # (spread exponents: some blocks more than the fold's range below their group's top,
        # so that the fold rounds and counts)
        axis = kw.get("axis", -1) % len(shape)
        moved = shape[:axis] + shape[axis + 1:] + (shape[axis],)
        spread = torch.exp2(torch.randint(-12, 4, moved[:-1] + (moved[-1] // 32,),
                                          generator=g)).repeat_interleave(32, -1)
        x = (torch.randn(moved, generator=g) * spread).movedim(-1, axis).to(dtype).contiguous()
        keys = torch.tensor([seed, 0x5A5A ^ i], dtype=torch.int64) if with_keys else None
        before = int(fold.inexact_total("cpu"))
        got = fold.quantize_folded(x, fmt, group, seed=seed, keys=keys, **kw)
        rounded += int(fold.inexact_total("cpu")) - before
        ref_kw = {k: v for k, v in kw.items() if k != "tuning"}
        want = fold.quantize_folded(x, fmt, group, seed=seed, keys=keys, backend="emulator",
                                    **ref_kw)
        _same_fold(got, want)
        expected += int(want.stats[1])
    # (a seed specializes as in test_repeated_calls_take_the_plan_and_keep_the_bits: 0, 5 and
    # 2^40 + 3 went through ``run`` first; keys specialize on the key tensor alone)
    hits = 5 if with_keys else 3
    assert plans.STATS.made == 1 and plans.STATS.hits == hits
    assert sum(s.launches for s in cpu_plans) == hits
    assert expected > 0 and rounded == expected
    plan, = plans.PLANS.values()
    assert isinstance(plan, plans.FoldPlan)
    assert (plan.move is not None) == (kw.get("tuning") is TRANSPOSE)
    if kw.get("tuning") is FOLD_AXIS0:
        assert plan.k32.kernel is launch.kernels.both_axes.columns_fold_kernel


@pytest.mark.parametrize("fmt,shape,kw", [
    ("e2m1", (3, 520 * 32), dict(pow2=True)),                     # 520 blocks: 9 chunks
    ("e2m1", (2, 544 * 32), dict(rotation="hadamard16")),         # 544 blocks
    ("e3m2", (96, 8), dict(axis=0, pow2=True, rounding="stochastic",  # along axis 0, the
                           tuning=FOLD_COLUMNS))])  # column kernel (which groups it takes:
#                                   test_fold.py::test_which_folds_the_quantize_pass_takes)
def test_repeated_whole_row_folds_take_their_plan(cpu_plans, fmt, shape, kw, monkeypatch):
    """``quantize_folded(x, fmt, None)`` where a whole row is not a fused fold group
    (``fold.fused_in_quantize``: more than ``FUSED_ROW_FOLD_MAX_GROUP`` blocks, or on the
    column kernel more than ``FUSED_FOLD_MAX_GROUP`` or not a power of two): quantize, then
    the two launches of the whole-row fold. The first call leaves a ``TwoPassFoldPlan`` (its
    quantize's plan, then the fold) and a ``RowFoldPlan``; later calls (new data and seeds)
    take them, never the whole way, and give the emulator's codes, exponents, scales, stats and 2^R, adding
    their rounded elements to the device's total; ``fold(mx, None)`` on stored codes takes the
    row plan too. Another chunk size (``fold.fold_row_chunk``, what the tile sweep changes) is
    another plan."""
    from ocpmx.native import fold
    whole_way = []
    real = fold.quantize_folded_kmajor
    monkeypatch.setattr(fold, "quantize_folded_kmajor", lambda x, *a, **k: whole_way.append(
        a[-4]) or real(x, *a, **k))  # (a[-4]: the backend)
    g = torch.Generator().manual_seed(3)
    axis = kw.get("axis", -1) % len(shape)
    k = shape[axis]
    assert not fold.fused_in_quantize(torch.empty(shape), axis, k // 32,
                                      kw.get("tuning", native.default_tuning()))
    rounded = expected = 0
    for seed in (0, 5, 6, 9):
        moved = shape[:axis] + shape[axis + 1:] + (k,)
        spread = torch.exp2(torch.randint(-14, 4, moved[:-1] + (k // 32,), generator=g)
                            ).repeat_interleave(32, -1)
        x = (torch.randn(moved, generator=g) * spread).movedim(-1, axis).bfloat16().contiguous()
        before = int(fold.inexact_total("cpu"))
        got = fold.quantize_folded(x, fmt, None, seed=seed, **kw)
        rounded += int(fold.inexact_total("cpu")) - before
        want = fold.quantize_folded(x, fmt, None, seed=seed, backend="emulator", **kw)
        _same_fold(got, want)
        expected += int(want.stats[1])
    assert expected > 0 and rounded == expected
    assert whole_way.count(None) == 1  # the first call; the emulator's go the whole way
    two_pass = [p for p in plans.PLANS.values() if isinstance(p, plans.TwoPassFoldPlan)]
    assert len(two_pass) == 1 and two_pass[0].quantize.compiled  # (a kernel per seed kind)
    row_plans = [p for p in plans.PLANS.values() if isinstance(p, plans.RowFoldPlan)]
    assert len(row_plans) == 1 and len(row_plans[0].compiled) == 1
    q = launch.kernels.quantize
    fold_kernels = (q.fold_rows_kernel, q.fold_rows_finish_kernel)

    def planned_fold_launches():  # (a whole-way launch runs outside its stand-in's count)
        return sum(s.launches for s in cpu_plans if s.kernel in fold_kernels)
    assert planned_fold_launches() == 3 * 2  # the repeated calls: both launches, planned
    mx = native.quantize(x, fmt, **{n: v for n, v in kw.items() if n != "pow2"}, seed=9)
    for _ in range(2):  # stored codes: the same combination of the fold unless 2^R was asked
        f = fold.fold(mx, None)
    assert planned_fold_launches() == (4 if kw.get("pow2") else 5) * 2
    for name in ("codes", "exponents", "scales", "stats"):
        assert torch.equal(getattr(f, name), getattr(want, name)), name
    made = plans.STATS.made
    chunks = fold.FOLD_ROW_CHUNK, fold.FOLD_ROW_LONG_CHUNK
    try:
        fold.FOLD_ROW_CHUNK = fold.FOLD_ROW_LONG_CHUNK = 16
        _same_fold(fold.quantize_folded(x, fmt, None, seed=9, **kw), want)
    finally:
        fold.FOLD_ROW_CHUNK, fold.FOLD_ROW_LONG_CHUNK = chunks
    assert plans.STATS.made == made + 1


def test_fold_plans_are_keyed_on_every_argument(cpu_plans):
    """Another group, 2^R or not, format, axis, rotation or shape is another combination:
    each goes the whole way first, and none takes another's launch."""
    from ocpmx.native import fold
    x = torch.randn(128, 256).bfloat16()
    calls = [dict(), dict(group=8), dict(pow2=True), dict(fmt="e3m2"),
             dict(axis=0, tuning=TRANSPOSE), dict(rotation="hadamard16"),
             dict(x=x[:64]), dict(scale_rule="even")]
    for kw in calls + calls:
        kw = dict(kw)
        xx, fmt, group = kw.pop("x", x), kw.pop("fmt", "e2m1"), kw.pop("group", 4)
        got = fold.quantize_folded(xx, fmt, group, **kw)
        kw.pop("tuning", None)
        _same_fold(got, fold.quantize_folded(xx, fmt, group, backend="emulator", **kw))
    assert plans.STATS.made == len(calls) and plans.STATS.hits == len(calls)


def test_fold_custom_op_takes_plans(cpu_plans):
    """``ocpmx::quantize_folded``'s implementation (what a compiled MXLinear calls) makes and
    takes a plan of its own, with the op's results (2^R an empty tensor where not asked)."""
    from ocpmx.native import fold, library
    x = torch.randn(128, 64).bfloat16()
    for seed in (3, 4, 5):
        for pow2 in (False, True):
            want = fold.quantize_folded(x, "e2m1", 4, axis=0, pow2=pow2, seed=seed,
                                        rounding="stochastic", backend="emulator")
            codes, exps, scales, stats, p2 = library.quantize_folded_op(
                x, "e2m1", "floor", "stochastic", "none", 0, 4, pow2, seed, None, "")
            _same_fold(fold.FoldedTensor(codes, exps, scales, 4, want.fmt, stats,
                                         p2 if pow2 else None), want)
            assert p2.numel() == (want.pow2.numel() if pow2 else 0)
    assert plans.STATS.made == 2 and plans.STATS.hits == 4


def test_two_pass_fold_plan_serves_the_custom_op_with_keys(cpu_plans):
    """``ocpmx::quantize_folded`` (a compiled MXLinear's operands) on rows its quantize pass
    cannot fold (whole rows of 544 blocks): the first call leaves a ``TwoPassFoldPlan`` of its
    own; later calls take it, read the key tensor each is given (stochastic rounding and the
    signs from it), and return the op's five tensors with the emulator's bits."""
    from ocpmx.native import fold, library
    g = torch.Generator().manual_seed(4)
    whole_row = 544
    rot = Rotation(16, mask=0)
    x = torch.randn(2, whole_row * 32, generator=g).bfloat16()
    for i, seed in enumerate((1, 2, 2, 9)):
        keys = torch.tensor([seed, 0x5A5A ^ i], dtype=torch.int64)
        want = fold.quantize_folded(x, "e2m1", None, rounding="stochastic", rotation=rot,
                                    keys=keys, backend="emulator")
        codes, exps, scales, stats, p2 = library.quantize_folded_op(
            x, "e2m1", "floor", "stochastic", rot.name, 1, whole_row, False, 0, keys,
            "")
        _same_fold(fold.FoldedTensor(codes, exps, scales, whole_row, want.fmt, stats), want)
        assert p2.numel() == 0
    two_pass = [p for p in plans.PLANS.values() if isinstance(p, plans.TwoPassFoldPlan)]
    assert len(two_pass) == 1 and two_pass[0].result is library._folded_parts
    q = launch.kernels.quantize
    served = [s for s in cpu_plans if s.kernel not in (q.fold_rows_kernel,
                                                         q.fold_rows_finish_kernel)]
    assert sum(s.launches for s in served) == 3  # the quantize launch of the repeated calls


@pytest.mark.parametrize("dtype,rotation", [(torch.bfloat16, None),
                                             (torch.float32, "hadamard16")])
def test_both_axes_calls_take_a_plan(cpu_plans, dtype, rotation):
    """A repeated ``quantize_dequantize_both_axes`` call (MXLinear's X and ∇Y) takes the
    launch its first call left, through the stand-in, with new data each time: the values
    along both axes are the two one-axis calls' of the emulator (an input that requires grad
    too, and no output does). Its custom op makes and takes a plan of its own, K-major along
    axis 0."""
    from ocpmx.native import library
    g = torch.Generator().manual_seed(1)
    kernel = launch.kernels.both_axes.qdq_both_axes_kernel
    for i in range(4):
        x = (torch.randn(96, 64, generator=g) * 3).to(dtype).requires_grad_(i % 2 == 1)
        rows, cols = native.quantize_dequantize_both_axes(x, "e2m1", rotation=rotation)
        assert not rows.requires_grad and not cols.requires_grad
        x = x.detach()
        for got, axis in ((rows, -1), (cols, 0)):
            want = _reference(x, "e2m1", True, axis=axis, rotation=rotation)
            assert got.shape == x.shape and torch.equal(got.view(torch.int16),
                                                        want.view(torch.int16))
        op_rows, op_cols = library.quantize_dequantize_both_axes_op(
            x, "e2m1", "floor", rotation or "none", "")
        assert torch.equal(op_rows.view(torch.int16), rows.view(torch.int16))
        assert op_cols.shape == x.shape[::-1] and \
            torch.equal(op_cols.view(torch.int16), cols.t().view(torch.int16))
        assert plans.STATS.made == 2 and plans.STATS.hits == 2 * i
    assert [s.kernel for s in cpu_plans] == [kernel, kernel]
    assert sum(s.launches for s in cpu_plans) == 6
    assert sum(s.addresses for s in cpu_plans) == 6 * 3  # (input, rows, columns)
    assert all(isinstance(p, plans.BothAxesPlan) for p in plans.PLANS.values())


def test_both_axes_plan_is_keyed_on_every_argument(cpu_plans):
    """Another format, rotation, tuning or shape is another combination: each goes the whole
    way first, and none takes another's launch (its bits would be another's)."""
    x = torch.randn(64, 96).bfloat16()
    tiles = dataclasses.replace(native.default_tuning(), both_axes=(32, 1))
    calls = [dict(), dict(fmt="e4m3"), dict(rotation="hadamard16"), dict(tuning=tiles),
             dict(x=x[:32]), dict(scale_rule="even")]
    for kw in calls + calls:
        kw = dict(kw)
        xx, fmt = kw.pop("x", x), kw.pop("fmt", "e2m1")
        rows, cols = native.quantize_dequantize_both_axes(xx, fmt, **kw)
        kw.pop("tuning", None)
        for got, axis in ((rows, -1), (cols, 0)):
            want = _reference(xx, fmt, True, axis=axis, **kw)
            assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert plans.STATS.made == len(calls) and plans.STATS.hits == len(calls)


def test_fastlaunch_off_or_compiling_takes_no_plan(cpu_plans, monkeypatch):
    x = torch.randn(32, 64)
    native.quantize(x, "e2m1")
    assert plans.key("quantize", x, (), None) is not None
    monkeypatch.setattr(fastlaunch, "ENABLED", False)
    assert plans.key("quantize", x, (), None) is None
    native.quantize(x, "e2m1")
    assert plans.STATS.hits == 0
    monkeypatch.setattr(fastlaunch, "ENABLED", True)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert plans.key("quantize", x, (), None) is None


def test_plans_stay_off_cpu_tensors_by_default():
    """Outside these tests a CPU tensor never takes a plan (the interpreter's launches return
    no compiled kernel, and CPU is not among ``DEVICE_TYPES``)."""
    assert plans.DEVICE_TYPES == ("cuda",)
    assert plans.key("quantize", torch.zeros(32), (), None) is None


@pytest.mark.skipif(not GPU, reason="needs a GPU: plans keep compiled kernels")
@pytest.mark.parametrize("qdq", [False, True])
def test_plans_same_bits_gpu(qdq, monkeypatch):
    """On the GPU: repeated calls (rows and columns, RNE and stochastic, keys, a misaligned
    input) through their plans give the bits of calls that take none, and do take them, for
    seeds and key values other than the first call's (1, 16 and 2^64 - 1 specialize Triton's
    kernels differently)."""
    op = native.quantize_dequantize if qdq else native.quantize
    base = torch.randn(3 * 64 * 96 + 4, device="cuda")
    keys = torch.tensor([7, 0x3C3C], dtype=torch.int64, device="cuda")
    inputs = [base[:64 * 96].view(64, 96).bfloat16(), base[1:1 + 64 * 96].view(64, 96),
              base[:3 * 64 * 96].view(3, 64, 96).half()]
    options = [dict(rotation="hadamard16"), dict(rounding="stochastic"),
               dict(axis=-2, rotation="hadamard16", tuning=COLUMNS),
               dict(axis=-2, rounding="stochastic", tuning=TRANSPOSE),
               dict(rounding="stochastic", keys=keys, rotation=Rotation(16, mask=0))]

    def run_all(seed, key_values):
        keys.copy_(torch.tensor(key_values))
        out = []
        for x in inputs:
            for kw in options:
                r = op(x, "e2m1", **{"seed": seed, **kw})
                out += [r.view(torch.int16).clone()] if qdq else \
                    [r.data.clone(), r.scales_kmajor.clone()]
        torch.cuda.synchronize()
        return out
    plans.clear()
    run_all(5, [7, 0x3C3C])  # the plans made (and Triton's kernels compiled)
    for seed, key_values in ((6, [8, 0x0FF0]), (1, [1, 0x5555]), (16, [2**62, 0]),
                             (2**64 - 1, [-1, 0xFFFF])):
        monkeypatch.setattr(plans, "DEVICE_TYPES", ())
        ref = run_all(seed, key_values)
        monkeypatch.setattr(plans, "DEVICE_TYPES", ("cuda",))
        hits = plans.STATS.hits
        got = run_all(seed, key_values)
        assert plans.STATS.hits > hits
        for r, g in zip(ref, got, strict=True):
            assert torch.equal(r, g)
    assert plans.STATS.made == len(inputs) * len(options)


@pytest.mark.skipif(not GPU, reason="needs a GPU: plans keep compiled kernels")
def test_fold_plans_same_bits_gpu(monkeypatch):
    """On the GPU: repeated ``quantize_folded`` calls (rows with 2^R, stochastic with keys
    and H16, along axis 0 by the device's default path, by the transpose and by the column
    kernel; a misaligned input) through their ``FoldPlan`` give the bits and the
    rounded-element counts of calls that take none, and do take them."""
    from ocpmx.native import fold
    spread = torch.exp2(torch.randint(-12, 4, (256, 8), device="cuda")).repeat_interleave(32, 1)
    orig = torch.randn(256 * 256 + 4, device="cuda")
    base = orig.clone()
    keys = torch.tensor([7, 0x3C3C], dtype=torch.int64, device="cuda")
    inputs = [lambda: (base[:256 * 256].view(256, 256) * spread).bfloat16(),
              lambda: base[1:1 + 256 * 256].view(256, 256)]
    options = [dict(pow2=True), dict(rounding="stochastic", keys=keys,
                                     rotation=Rotation(16, mask=0)),
               dict(axis=0), dict(axis=0, pow2=True, tuning=TRANSPOSE),
               dict(axis=0, tuning=FOLD_COLUMNS), dict(axis=0, pow2=True, tuning=FOLD_AXIS0)]

    counts = []

    def run_all(seed, key_values):
        keys.copy_(torch.tensor(key_values))
        base.copy_(orig * (seed % 7 + 1))
        out = []
        for x in inputs:
            for kw in options:
                before = fold.inexact_total("cuda").clone()
                f = fold.quantize_folded(x(), "e2m1", 4, seed=seed, **kw)
                rounded = fold.inexact_total("cuda") - before
                counts.append(int(rounded))
                out += [f.codes.clone(), f.exponents.clone(), f.scales.clone(), f.stats.clone(),
                        rounded]
                out += [f.pow2.view(torch.int32).clone()] if f.pow2 is not None else []
        torch.cuda.synchronize()
        return out
    plans.clear()
    run_all(5, [7, 0x3C3C])
    for seed, key_values in ((6, [8, 0x0FF0]), (1, [1, 0x5555]), (2**64 - 1, [-1, 0xFFFF])):
        monkeypatch.setattr(plans, "DEVICE_TYPES", ())
        ref = run_all(seed, key_values)
        monkeypatch.setattr(plans, "DEVICE_TYPES", ("cuda",))
        hits = plans.STATS.hits
        got = run_all(seed, key_values)
        assert plans.STATS.hits > hits
        for r, g in zip(ref, got, strict=True):
            assert torch.equal(r, g)
    assert sum(counts) > 0  # (the spread input's folds rounded, and counted)
    assert plans.STATS.made == len(inputs) * len(options)


@pytest.mark.skipif(not GPU, reason="needs a GPU: plans keep compiled kernels")
def test_both_axes_plans_same_bits_gpu(monkeypatch):
    """On the GPU: repeated ``quantize_dequantize_both_axes`` calls through their plans give
    the bits of calls that take none (bf16 and float32 input, a misaligned one, no rotation
    and H16), and do take them."""
    orig = torch.randn(128 * 96 + 8, device="cuda")
    base = orig.clone()
    inputs = [lambda: base[:128 * 96].view(128, 96).bfloat16(),
              lambda: base[4:4 + 128 * 96].view(128, 96),
              lambda: base[1:1 + 128 * 96].view(128, 96)]  # (misaligned)
    options = [dict(), dict(rotation="hadamard16"), dict(fmt="e4m3")]

    def run_all(scale):
        base.copy_(orig * scale)
        out = []
        for x in inputs:
            for kw in options:
                kw = dict(kw)
                rows, cols = native.quantize_dequantize_both_axes(x(), kw.pop("fmt", "e2m1"),
                                                                  **kw)
                out += [rows.view(torch.int16).clone(), cols.contiguous().view(torch.int16)]
        torch.cuda.synchronize()
        return out
    plans.clear()
    run_all(1.0)  # the plans made (and Triton's kernels compiled)
    assert plans.STATS.made == len(inputs) * len(options)
    for scale in (2.0, 0.375, 1e-30):
        monkeypatch.setattr(plans, "DEVICE_TYPES", ())
        ref = run_all(scale)
        monkeypatch.setattr(plans, "DEVICE_TYPES", ("cuda",))
        hits = plans.STATS.hits
        got = run_all(scale)
        assert plans.STATS.hits == hits + len(inputs) * len(options)
        for r, g in zip(ref, got, strict=True):
            assert torch.equal(r, g)


@pytest.mark.skipif(not GPU, reason="needs a GPU: plans keep compiled kernels")
def test_row_fold_plans_same_bits_gpu(monkeypatch):
    """On the GPU: repeated whole-row ``quantize_folded`` calls (the rowwise GEMM method's
    operands where a row is longer than ``FUSED_ROW_FOLD_MAX_GROUP``: 520 blocks a row, 17
    chunks; with 2^R and H16; along axis 0) through their ``RowFoldPlan`` give the bits and
    rounded-element counts of calls that take no plan."""
    from ocpmx.native import fold
    assert 520 > fold.FUSED_ROW_FOLD_MAX_GROUP
    spread = torch.exp2(torch.randint(-16, 4, (64, 520), device="cuda")).repeat_interleave(32, 1)
    base = torch.randn(64, 520 * 32, device="cuda")
    options = [dict(pow2=True, rotation="hadamard16"), dict(axis=0, pow2=True)]

    def run_all(scale):
        out = []
        for kw in options:
            x = (base * spread * scale).bfloat16()
            x = x.t().contiguous() if kw.get("axis") == 0 else x
            before = fold.inexact_total("cuda").clone()
            f = fold.quantize_folded(x, "e2m1", None, **kw)
            out += [f.codes.clone(), f.exponents.clone(), f.stats.clone(),
                    f.pow2.view(torch.int32).clone(), fold.inexact_total("cuda") - before]
        torch.cuda.synchronize()
        return out
    taken = []
    real = plans.run_row_fold
    monkeypatch.setattr(plans, "run_row_fold", lambda *a: taken.append(real(*a)) or taken[-1])
    plans.clear()
    run_all(1.0)
    for scale in (2.0, 0.5, 3.0):
        monkeypatch.setattr(plans, "DEVICE_TYPES", ())
        ref = run_all(scale)
        monkeypatch.setattr(plans, "DEVICE_TYPES", ("cuda",))
        taken.clear()
        got = run_all(scale)
        assert taken == [True] * len(options)  # (each call's fold through the row plan)
        for r, g in zip(ref, got, strict=True):
            assert torch.equal(r, g)
        assert int(ref[2][1]) + int(ref[7][1]) > 0  # (folds rounded, and were counted)
    # (both options fold K-major codes of (64, 16640): one combination of the row fold)
    assert sum(isinstance(p, plans.RowFoldPlan) for p in plans.PLANS.values()) == 1

"""``kernels.both_axes``: ``native.quantize_dequantize_both_axes`` (a matrix
quantize-dequantized along its last axis and along axis 0 in one pass, the bits of the two
one-axis calls), and along axis 0 alone ``columns_kernel`` (``Tuning.columns`` /
``columns_qdq`` = 'both_axes'), the column kernel's bits.

Runs on the GPU when there is one, else on the CPU through the Triton interpreter."""
import contextlib
import dataclasses

import numpy as np
import pytest
import torch

from ocpmx import native
from ocpmx.native import launch
from ocpmx.spec import Rotation
from native_util import devices, kernel_sass
from test_native_quantize import all_bf16_blocks


def bits(t):
    return t.contiguous().view(torch.int16).cpu().numpy()


def same(got, want):
    """Bits and layout: the values and the strides of the one-axis calls' results (a GEMM's
    kernel choice, so its bits, may follow the operand's layout)."""
    return got.stride() == want.stride() and np.array_equal(bits(got), bits(want))


def two_calls(x, fmt, **kw):
    return (native.quantize_dequantize(x, fmt, axis=-1, **kw),
            native.quantize_dequantize(x, fmt, axis=0, **kw))


BOTH = "qdq_both_axes_kernel"    # the two outputs' kernel
COLUMNS = "columns_kernel"        # along axis 0 alone


@contextlib.contextmanager
def kernel_launches():
    """The names of the ``kernels.both_axes`` kernels launched inside the block, one entry per
    launch (``launch.run`` recorded: no per-call plans meanwhile)."""
    launched = []
    real = launch.run
    ours = {launch.kernels.both_axes.qdq_both_axes_kernel: BOTH,
            launch.kernels.both_axes.columns_kernel: COLUMNS}

    def record(kernel, grid, *a, **kw):
        if kernel in ours:
            launched.append(ours[kernel])
        return real(kernel, grid, *a, **kw)
    launch.run = record
    try:
        yield launched
    finally:
        launch.run = real


def one_pass(x, fmt, columns=None, **kw):
    """The kernel's two outputs (``columns``: its tile width), checking that it ran."""
    tuning = native.default_tuning(x.device)
    if columns:
        tuning = dataclasses.replace(tuning, both_axes=(columns, 2))
    with kernel_launches() as launched:
        out = native.quantize_dequantize_both_axes(x, fmt, tuning=tuning, **kw)
    assert launched == [BOTH], "the one-pass kernel did not run (both outputs)"
    return out


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("fmt", ["e2m1", "e3m2", "e2m3", "e4m3", "e5m2"])
def test_every_bf16_value_along_both_axes(device, fmt):
    """Every bf16 bit pattern (NaN, Inf, subnormals; shuffled blocks and blocks of neighbouring
    magnitudes) as a (2048, 32) matrix, each 32-row band a block along axis 0 and each row one
    along the last axis, under every scale rule (E2M1; the other formats under 'even' and
    'rceil'): the bits of the two one-axis calls."""
    x = torch.from_numpy(all_bf16_blocks(3)).to(torch.bfloat16).to(device)
    for rule in ("floor", "ceil", "rceil", "even") if fmt == "e2m1" else ("even", "rceil"):
        got = one_pass(x, fmt, scale_rule=rule)
        want = two_calls(x, fmt, scale_rule=rule)
        for g, w, axis in zip(got, want, ("last", "0")):
            assert g.shape == w.shape and g.dtype == torch.bfloat16
            assert same(g, w), (rule, axis)


@pytest.mark.parametrize("device", devices())
def test_shapes_dtypes_and_tiles(device):
    """float32, float16 and bf16 input, matrices narrower than a tile, a last program cut
    short (96 columns on tiles of 64), several bands of rows, tiles of 32 to 256 columns, and
    a matrix of 2^25 elements (every program of a large grid): the two one-axis calls' bits."""
    rng = np.random.default_rng(1)
    for (rows, cols, columns) in ((64, 96, 64), (32, 32, 128), (96, 64, 32), (32, 512, 256),
                                  (128, 160, 32)):
        x = rng.standard_normal((rows, cols)) * np.exp2(rng.integers(-30, 30, (rows, cols)))
        x[3, :32] = 0
        x[:, 5] *= 2.0 ** -120
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            t = torch.from_numpy(x.astype(np.float32)).to(dtype).to(device)
            got = one_pass(t, "e2m1", columns, scale_rule="even")
            want = two_calls(t, "e2m1", scale_rule="even")
            for g, w in zip(got, want):
                assert same(g, w), (rows, cols, columns, dtype)
    if device != "cpu":  # (the interpreter's cost is per program)
        t = torch.randn(4096, 8192, device=device, dtype=torch.bfloat16)
        for g, w in zip(one_pass(t, "e2m1", scale_rule="even"),
                        two_calls(t, "e2m1", scale_rule="even")):
            assert same(g, w)


@pytest.mark.parametrize("device", devices())
def test_fixed_hadamard_rotations_along_each_axis(device):
    """H16 and H32 (no random signs): each output's blocks rotated along its own axis in the
    emulator's order, then quantize-dequantized: the two one-axis calls' bits, formats with
    and without exact bf16 values, bf16 and float32 input, a masked last program, NaN/Inf."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((64, 96)) * np.exp2(rng.integers(-20, 20, (64, 96)))
    x[0, :3] = [np.nan, np.inf, -np.inf]
    x[7, 32:64] = 0
    for rot in ("hadamard16", "hadamard32"):
        for fmt, dtype in (("e2m1", torch.bfloat16), ("e4m3", torch.float32)):
            t = torch.from_numpy(x.astype(np.float32)).to(dtype).to(device)
            kw = dict(scale_rule="even", rotation=rot)
            for g, w in zip(one_pass(t, fmt, 64, **kw), two_calls(t, fmt, **kw)):
                assert same(g, w), (rot, fmt, dtype)


@pytest.mark.parametrize("device", devices())
def test_other_numerics_are_the_two_calls(device):
    """Where the kernel does not apply (stochastic rounding, a rotation with random signs,
    AMD's gfx950 conversions, INT8, the emulator backend) the function is the two calls,
    options passed on; no launch of the one-pass kernel."""
    x = torch.randn(64, 64).to(device)
    with kernel_launches() as launched:
        for fmt, kw in (("e2m1", dict(rounding="stochastic", seed=5)),
                        ("e2m1", dict(rotation=Rotation(16, 11))),
                        ("e2m1", dict(conversion="gfx950")), ("int8", {}),
                        ("e2m1", dict(backend="emulator"))):
            t = x.cpu() if kw.get("backend") == "emulator" else x
            for g, w in zip(native.quantize_dequantize_both_axes(t, fmt, **kw),
                            two_calls(t, fmt, **kw)):
                assert same(g, w), (fmt, kw)
    assert not launched


def _axis0(op, x, fmt, tuning, **kw):
    """``op(x, fmt, axis=0)`` (``native.quantize`` or ``quantize_dequantize``) under
    ``tuning``, and how many launches of the axis-0 kernel it made (of no other of the
    module's)."""
    with kernel_launches() as launched:
        out = op(x, fmt, axis=0, tuning=tuning, **kw)
    assert set(launched) <= {COLUMNS}, launched
    return out, len(launched)


def same_mx(got, want):
    """Codes and scale bytes of two quantize results, and their shapes."""
    return all(g.shape == w.shape and g.dtype == w.dtype and torch.equal(g.cpu(), w.cpu())
               for g, w in ((got.data, want.data), (got.scales_kmajor, want.scales_kmajor)))


AXIS0_CASES = (("e2m1", None, torch.bfloat16), ("e2m1", "hadamard16", torch.float32),
               ("e3m2", "hadamard32", torch.bfloat16), ("e2m3", None, torch.float16),
               ("e4m3", None, torch.float32), ("e5m2", "hadamard16", torch.bfloat16))


def axis0_inputs(seed, shapes=((64, 96), (64, 48), (96, 4, 24), (32, 8), (64, 3, 5))):
    """Matrices and 3-D tensors with random magnitudes over 60 octaves, NaN, Inf and zero
    blocks; by default widths not a multiple of a tile or of 32 (48, 8, 15 columns after
    axis 0); ``shapes``: others, as (shape, array) pairs the same way."""
    rng = np.random.default_rng(seed)
    for shape in shapes:
        x = rng.standard_normal(shape) * np.exp2(rng.integers(-30, 30, shape))
        x.reshape(shape[0], -1)[0, :3] = [np.nan, np.inf, -np.inf]
        x.reshape(shape[0], -1)[32:64, 5] = 0
        yield shape, x


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("op", ["quantize", "quantize_dequantize"])
def test_columns_through_the_both_axes_kernel(device, op):
    """``Tuning.columns='both_axes'`` (quantize) and ``columns_qdq='both_axes'``
    (quantize-dequantize): along axis 0 one launch of ``columns_kernel``, with the column
    kernel's bits (codes and scale bytes; values and strides) for every float format, no
    rotation, H16 and H32, bf16 / float16 / float32 input, widths not a multiple of the tile
    or of 32 (masked), more than two dimensions (axis 0 against the rest flattened), tiles of
    32 to 128 columns; NaN, Inf and zero blocks; every scale rule on E2M1."""
    base = native.default_tuning(torch.device(device))
    field = "columns" if op == "quantize" else "columns_qdq"
    fn, check = ((native.quantize, same_mx) if op == "quantize"
                 else (native.quantize_dequantize, same))
    kernel = dataclasses.replace(base, **{field: "kernel"})
    for shape, x in axis0_inputs(7):
        for columns in (32, 128):
            tuning = dataclasses.replace(base, **{field: "both_axes"}, both_axes=(columns, 2))
            for fmt, rot, dtype in AXIS0_CASES:
                t = torch.from_numpy(x.astype(np.float32)).to(dtype).to(device)
                for rule in ("floor", "ceil", "rceil", "even") if fmt == "e2m1" else ("even",):
                    kw = dict(scale_rule=rule, rotation=rot)
                    got, runs = _axis0(fn, t, fmt, tuning, **kw)
                    want = fn(t, fmt, axis=0, tuning=kernel, **kw)
                    assert runs == 1, (shape, fmt, rot)
                    assert check(got, want), (shape, columns, fmt, rot, dtype, rule)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("blocks", [2, 4])
def test_columns_with_several_blocks_a_program(device, blocks, monkeypatch):
    """``Tuning.both_axes_blocks``: ``columns_kernel`` quantizes 2 or 4 blocks of each column
    per program and stores each column's codes and scales together, with the column kernel's
    bits (codes and scale bytes) for every float format, no rotation, H16 and H32, bf16 /
    float16 / float32 input, masked widths, NaN, Inf and zero blocks, every scale rule on
    E2M1; the blocks per program halve where they do not tile axis 0 (3 and 6 blocks), and
    quantize-dequantize keeps one block a program."""
    base = native.default_tuning(torch.device(device))
    kernel = dataclasses.replace(base, columns="kernel")
    taken = []
    real = launch.run

    def record(kern, grid, *a, **kw):
        if kern is launch.kernels.both_axes.columns_kernel:
            taken.append((kw["KB"], kw["QDQ"], grid[0]))
        return real(kern, grid, *a, **kw)
    monkeypatch.setattr(launch, "run", record)
    for shape, x in axis0_inputs(11, ((128, 96), (96, 4, 24), (192, 40), (64, 3, 5))):
        k = shape[0] // 32
        kb = max(b for b in (1, 2, 4) if b <= blocks and k % b == 0)
        for columns in ((32, 64) if blocks == 2 else (64,)):
            tuning = dataclasses.replace(base, columns="both_axes", columns_qdq="both_axes",
                                         both_axes=(columns, 2), both_axes_blocks=blocks)
            for fmt, rot, dtype in AXIS0_CASES:
                t = torch.from_numpy(x.astype(np.float32)).to(dtype).to(device)
                for rule in ("floor", "ceil", "rceil", "even") if fmt == "e2m1" else ("even",):
                    kw = dict(scale_rule=rule, rotation=rot)
                    taken.clear()
                    got = native.quantize(t, fmt, axis=0, tuning=tuning, **kw)
                    assert taken == [(kb, False, k // kb)], (shape, blocks, taken)
                    want = native.quantize(t, fmt, axis=0, tuning=kernel, **kw)
                    assert same_mx(got, want), (shape, columns, fmt, rot, dtype, rule)
            taken.clear()
            native.quantize_dequantize(t, "e2m1", axis=0, tuning=tuning)
            assert taken == [(1, True, k)]


@pytest.mark.parametrize("device", devices())
def test_columns_quantize_every_bf16_value(device):
    """Every bf16 bit pattern as a (32 x 2048) matrix quantized along axis 0 (each column a
    block: shuffled blocks and blocks of neighbouring magnitudes, NaN, Inf, subnormals) by
    ``columns_kernel``, E2M1 packed and E4M3 a byte a code, no rotation and H16: the column
    kernel's codes and scale bytes, and the emulator's."""
    base = native.default_tuning(torch.device(device))
    x = torch.from_numpy(all_bf16_blocks(3)).to(torch.bfloat16).to(device)
    x = x.reshape(-1, 32).t().contiguous()
    tuning = dataclasses.replace(base, columns="both_axes", both_axes=(64, 2))
    kernel = dataclasses.replace(base, columns="kernel")
    for fmt in ("e2m1", "e4m3"):
        for rot in (None, "hadamard16"):
            got, runs = _axis0(native.quantize, x, fmt, tuning, rotation=rot)
            assert runs == 1
            assert same_mx(got, native.quantize(x, fmt, axis=0, tuning=kernel, rotation=rot))
            assert same_mx(got, native.quantize(x.cpu(), fmt, axis=0, rotation=rot,
                                                backend="emulator")), (fmt, rot)


@pytest.mark.parametrize("device", devices())
def test_axis0_qdq_with_a_rotation_from_quarters(device, monkeypatch):
    """``Tuning.both_axes_quarters`` (the H200's): the axis-0 kernel's quantize-dequantize with
    a rotation loads each column's block as four 8-row quarters (in ``launch.quarter_form``'s
    form, in the other one, and with 64-bit offsets) and keeps the column kernel's bits: H16
    and H32, the float formats of ``AXIS0_CASES``, bf16 / float16 / float32 input, widths not a
    multiple of the tile or of 32, more than two dimensions, 32 and 128 columns a program; NaN,
    Inf and zero blocks. Without a rotation the flag changes nothing (no quarters)."""
    base = native.default_tuning(torch.device(device))
    kernel = dataclasses.replace(base, columns_qdq="kernel")
    taken = []
    real = launch.run
    monkeypatch.setattr(launch, "run", lambda k, g, *a, **kw: (
        taken.append(kw["QUARTERS"]) if k is launch.kernels.both_axes.columns_kernel else None)
        or real(k, g, *a, **kw))
    for form, big in ((1, False), (2, False), (launch.quarter_form(), True)):
        monkeypatch.setattr(launch, "quarter_form", lambda form=form: form)
        monkeypatch.setattr(launch, "BIG_NUMEL", 1 if big else 2**31)
        for shape, x in axis0_inputs(13, shapes=((64, 96), (64, 48), (96, 4, 24))):
            for columns in (32, 128):
                tuning = dataclasses.replace(base, columns_qdq="both_axes",
                                             both_axes=(columns, 2), both_axes_quarters=True)
                for fmt, rot, dtype in AXIS0_CASES:
                    if big and (rot is None or dtype != torch.bfloat16):
                        continue
                    t = torch.from_numpy(x.astype(np.float32)).to(dtype).to(device)
                    kw = dict(scale_rule="even", rotation=rot)
                    taken.clear()
                    got = native.quantize_dequantize(t, fmt, axis=0, tuning=tuning, **kw)
                    assert taken == [form if rot else 0], (fmt, rot, taken)
                    want = native.quantize_dequantize(t, fmt, axis=0, tuning=kernel, **kw)
                    assert same(got, want), (form, big, shape, columns, fmt, rot, dtype)


def test_axis0_qdq_quarters_convert_no_layout_for_sm90():
    """The H200's quantize-dequantize along tokens with H16 (``both_axes_quarters``, tile
    (128, 2)) compiled for sm_90a without the chip: in the load form ``launch.quarter_form``
    picks for the installed Triton no warp shuffle and no spill (Triton 3.6: 26.5 SASS
    instructions per element, the shuffling rows-of-columns load 33.0 with 112 shuffles); in
    the other form Triton converts the layout (shuffles). What it exists for: on an H200 0.76
    of copy against 0.70 (results/native_gpu/bench_columns_kernel_h200.md)."""
    facts = {form: kernel_sass("--both-axes", "128,2,1", "--qdq", "--rotations", 16,
                               "--quarter-form", form) for form in (1, 2)}
    good, other = facts[launch.quarter_form()], facts[3 - launch.quarter_form()]
    assert good["SHFL"] == 0 and good["STL"] == 0 and good["loads"] == ["LDG.E.U16"], good
    assert other["SHFL"] > 30, ("the other load form converts no layout either", other)


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("op", ["quantize", "quantize_dequantize"])
def test_columns_both_axes_leaves_the_rest_to_the_column_kernel(device, op):
    """Under 'both_axes' what ``columns_kernel`` does not take (stochastic rounding, random
    signs, INT8, an axis between others) runs the column kernel with the operation's column
    tile, and a fold (``columns_fold`` None follows ``columns``) folds through the column
    kernel: the bits of 'kernel', no launch of the both-axes kernels."""
    from ocpmx.native import fold as native_fold
    base = native.default_tuning(torch.device(device))
    field = "columns" if op == "quantize" else "columns_qdq"
    fn, check = ((native.quantize, same_mx) if op == "quantize"
                 else (native.quantize_dequantize, same))
    tuning = dataclasses.replace(base, **{field: "both_axes"}, columns_fold=None)
    kernel = dataclasses.replace(base, **{field: "kernel"}, columns_fold=None)
    x = torch.randn(64, 64).to(device)
    for fmt, kw, t in (("e2m1", dict(rounding="stochastic", seed=5), x),
                       ("e2m1", dict(rotation=Rotation(16, 11)), x),
                       ("int8", {}, x), ("e2m1", {}, x.reshape(2, 32, 64))):
        axis = 1 if t.dim() == 3 else 0
        with kernel_launches() as launched:
            got = fn(t, fmt, axis=axis, tuning=tuning, **kw)
        assert not launched, (fmt, kw)
        assert check(got, fn(t, fmt, axis=axis, tuning=kernel, **kw))
    if op == "quantize":
        with kernel_launches() as launched:
            got = native_fold.quantize_folded(x, "e2m1", 2, axis=0, tuning=tuning)
        assert not launched
        want = native_fold.quantize_folded(x, "e2m1", 2, axis=0, tuning=kernel)
        assert torch.equal(got.codes.cpu(), want.codes.cpu())
        assert torch.equal(got.scales.cpu(), want.scales.cpu())


@pytest.mark.parametrize("device", devices())
def test_columns_kernel_64_bit_offsets_and_grid_limits(device, monkeypatch):
    """The axis-0 kernel's 64-bit offsets (``BIG``, forced on a small tensor by lowering
    ``launch.BIG_NUMEL``) give the same bits, quantize and quantize-dequantize, with NaN, Inf
    and a masked width; a grid past CUDA's 65535 programs along the columns is no launch of it
    (``launch.columns32`` None: the caller takes the column kernel)."""
    from ocpmx.native import ops
    base = native.default_tuning(torch.device(device))
    tuning = dataclasses.replace(base, columns="both_axes", columns_qdq="both_axes",
                                 both_axes=(32, 2))
    kernel = dataclasses.replace(base, columns="kernel", columns_qdq="kernel")
    _, x = next(axis0_inputs(11))  # (64, 96): three programs of 32 columns
    t = torch.from_numpy(x[:, :40].astype(np.float32)).to(torch.bfloat16).to(device)
    want = (native.quantize(t, "e2m1", axis=0, tuning=kernel),
            native.quantize_dequantize(t, "e2m1", axis=0, tuning=kernel))
    big = []
    real = launch.run
    monkeypatch.setattr(launch, "BIG_NUMEL", 1)
    monkeypatch.setattr(launch, "run", lambda k, g, *a, **kw: (
        big.append(kw["BIG"]) if k is launch.kernels.both_axes.columns_kernel else None)
        or real(k, g, *a, **kw))
    got = (native.quantize(t, "e2m1", axis=0, tuning=tuning),
           native.quantize_dequantize(t, "e2m1", axis=0, tuning=tuning))
    assert big == [True, True]
    assert same_mx(got[0], want[0]) and same(got[1], want[1])
    n = ops.numerics("e2m1", "floor", "rne", None)
    wide = dataclasses.replace(base, both_axes=(64, 2))
    for inner, fits in ((65535 * 64, True), (65535 * 64 + 1, False)):
        x = torch.empty(32, inner, dtype=torch.bfloat16, device="meta")
        assert (launch.columns32(x, 32, inner, n, wide, False) is not None) is fits


@pytest.mark.parametrize("device", devices())
def test_grids_past_cuda_limits_take_the_two_calls(device):
    """A grid past CUDA's limits (2^31 - 1 programs along the first axis, 65535 along the
    second) is None, and ``both_axes_applies`` then takes the two calls: it checks the grid of
    the narrowest tile (32 columns), which bounds every tile's."""
    from ocpmx.native import ops
    assert launch.both_axes_grid(2**21, 4096, 128) == (2**16, 32)
    assert launch.both_axes_grid(64, 96, 128) == (2, 1)
    assert launch.both_axes_grid(32, 2**16 * 128, 128) is None
    assert launch.both_axes_grid(32 * 2**31, 128, 128) is None
    n = ops.numerics("e2m1", "even", "rne", None)
    for cols, applies in ((2**21 - 32, True), (2**21, False)):
        x = torch.empty(32, cols, dtype=torch.bfloat16, device=device)
        assert ops.both_axes_applies(x, n, "triton") is applies, cols


def test_bad_input_is_named():
    x = torch.randn(64, 64)
    with pytest.raises(ValueError, match="takes a matrix"):
        native.quantize_dequantize_both_axes(x.reshape(4, 16, 64), "e2m1")
    with pytest.raises(ValueError, match="axis 0 has length 48, not divisible"):
        native.quantize_dequantize_both_axes(x[:48], "e2m1")
    with pytest.raises(ValueError, match="axis 1 has length 40, not divisible"):
        native.quantize_dequantize_both_axes(x[:, :40], "e2m1")
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        native.quantize_dequantize_both_axes(x.to(torch.int32), "e2m1")
    with pytest.raises(ValueError, match="both_axes takes"):
        native.Tuning(both_axes=(48, 2))


def _linear_step(recipe, x, gy, both, monkeypatch, calls, compiled=False):
    """One MXLinear forward and backward (Triton backend, GEMM method 'bf16': the one the
    one-pass path feeds) with ``Tuning.linear_both_axes``
    on or off: (y, x.grad, weight.grad) as bf16/float bits."""
    from ocpmx.native import linear
    tuning = dataclasses.replace(native.default_tuning(x.device), linear_both_axes=both)
    monkeypatch.setattr(linear, "default_tuning", lambda device=None: tuning)
    if calls is None:  # (compiled: no Python side effect in the traced code)
        real = getattr(linear.quantize_dequantize_both_axes, "real", None)
        if real is not None:
            monkeypatch.setattr(linear, "quantize_dequantize_both_axes", real)
        return _run_linear(recipe, x, gy, compiled)
    real = getattr(linear.quantize_dequantize_both_axes, "real", None) or \
        linear.quantize_dequantize_both_axes

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)
    counted.real = real
    monkeypatch.setattr(linear, "quantize_dequantize_both_axes", counted)
    return _run_linear(recipe, x, gy, compiled)


def _run_linear(recipe, x, gy, compiled):
    torch.manual_seed(0)
    lin = native.MXLinear(64, 96, bias=False, recipe=recipe, backend="triton",
                          method="bf16").to(x.device)
    xx = x.clone().requires_grad_(True)
    f = torch.compile(lin, fullgraph=True) if compiled else lin
    y = f(xx)
    y.backward(gy)
    return [t.detach().float().cpu().numpy().view(np.int32) for t in (y, xx.grad, lin.weight.grad)]


@pytest.mark.parametrize("device", devices())
@pytest.mark.parametrize("recipe", ["mxfp4_all", "mxfp8", "mxfp4_all_h16", "mxfp4_wgrad",
                                    "mxfp4_all_sr_wgrad", "mxfp4_all_rht_wgrad",
                                    "mxfp4_all_h16_wgrad"])
def test_mxlinear_takes_both_axes_in_one_pass_with_the_same_bits(device, recipe, monkeypatch):
    """With ``Tuning.linear_both_axes`` MXLinear quantize-dequantizes X (Fprop + Wgrad) and ∇Y
    (Dgrad + Wgrad) in one pass each where the recipe gives both GEMMs RNE and no rotation or
    the same fixed one (``mxfp4_all``, ``mxfp8``, ``mxfp4_all_h16``: two calls;
    ``mxfp4_all_sr_wgrad``: its Wgrad rounds both operands stochastically, and
    ``mxfp4_all_rht_wgrad`` rotates them with random signs, and ``mxfp4_all_h16_wgrad``
    rotates only Wgrad's, so neither; ``mxfp4_wgrad``: Fprop and Dgrad in bf16, none), and the
    output and both gradients keep their bits."""
    rng = np.random.default_rng(2)
    x = torch.from_numpy(rng.standard_normal((2, 32, 64)).astype(np.float32)).to(device)
    gy = torch.from_numpy(rng.standard_normal((2, 32, 96)).astype(np.float32)).to(device)
    calls = []
    want = _linear_step(recipe, x, gy, False, monkeypatch, calls)
    assert not calls
    got = _linear_step(recipe, x, gy, True, monkeypatch, calls)
    assert len(calls) == {"mxfp4_all": 2, "mxfp8": 2, "mxfp4_all_h16": 2}.get(recipe, 0), recipe
    for g, w, what in zip(got, want, ("y", "x.grad", "weight.grad")):
        assert np.array_equal(g, w), (recipe, what)


@pytest.mark.parametrize("device", devices())
def test_mxlinear_both_axes_compiles_whole(device, monkeypatch):
    """Under ``torch.compile(fullgraph=True)`` (the custom op
    ``ocpmx::quantize_dequantize_both_axes``) the same bits as eager without it."""
    torch._dynamo.reset()
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal((2, 32, 64)).astype(np.float32)).to(device)
    gy = torch.from_numpy(rng.standard_normal((2, 32, 96)).astype(np.float32)).to(device)
    want = _linear_step("mxfp4_all", x, gy, False, monkeypatch, [])
    ran = []  # the op's implementation, called by the compiled graph
    real = native.ops.both_axes_impl
    monkeypatch.setattr(native.ops, "both_axes_impl", lambda *a: ran.append(1) or real(*a))
    got = _linear_step("mxfp4_all", x, gy, True, monkeypatch, None, compiled=True)
    assert len(ran) == 2  # X in the forward, ∇Y in the backward
    for g, w, what in zip(got, want, ("y", "x.grad", "weight.grad")):
        assert np.array_equal(g, w), what
    torch._dynamo.reset()


def test_environment_turns_linear_both_axes_on_or_off(monkeypatch):
    """OCPMX_LINEAR_BOTH_AXES=1 / 0 (read at import) over a GPU's default tuning."""
    from ocpmx.native import tuning
    for value, want in (("1", True), ("0", False), (None, tuning.GPU.linear_both_axes)):
        monkeypatch.setattr(tuning, "_LINEAR_BOTH_AXES", value)
        tuning._device_tuning.cache_clear()
        got = tuning._device_tuning(torch.device("cpu"))
        assert got.linear_both_axes is want
        assert dataclasses.replace(got, linear_both_axes=False) == \
            dataclasses.replace(tuning.GPU, linear_both_axes=False)
    tuning._device_tuning.cache_clear()


def test_environment_sets_columns_qdq(monkeypatch):
    """OCPMX_COLUMNS_QDQ (read at import) over a GPU's default tuning; a bad value is named."""
    from ocpmx.native import tuning
    try:
        for value, want in (("both_axes", "both_axes"), ("transpose", "transpose"),
                            (None, tuning.GPU.columns_qdq)):
            monkeypatch.setattr(tuning, "_COLUMNS_QDQ", value)
            tuning._device_tuning.cache_clear()
            got = tuning._device_tuning(torch.device("cpu"))
            assert got.columns_qdq == want
            assert dataclasses.replace(got, columns_qdq=None) == \
                dataclasses.replace(tuning.GPU, columns_qdq=None)
        monkeypatch.setattr(tuning, "_COLUMNS_QDQ", "rows")
        tuning._device_tuning.cache_clear()
        with pytest.raises(ValueError, match="OCPMX_COLUMNS_QDQ: columns_qdq must be"):
            tuning._device_tuning(torch.device("cpu"))
    finally:
        tuning._device_tuning.cache_clear()


@pytest.mark.parametrize("device", devices())
def test_mxlinear_both_axes_bias_bf16_frozen_input_and_no_grad(device, monkeypatch):
    """A bias, bf16 input, an input that needs no gradient (∇Y then feeds Wgrad alone: one
    call, for X), and evaluation under no_grad (no call: nothing is kept for a backward): the
    bits of the layer without the option."""
    from ocpmx.native import linear
    calls = []
    real = linear.quantize_dequantize_both_axes
    monkeypatch.setattr(linear, "quantize_dequantize_both_axes",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.standard_normal((64, 64)).astype(np.float32)).to(device)
    gy = torch.from_numpy(rng.standard_normal((64, 96)).astype(np.float32)).to(device)

    def run(both, x_grad):
        tuning = dataclasses.replace(native.default_tuning(x.device), linear_both_axes=both)
        monkeypatch.setattr(linear, "default_tuning", lambda device=None: tuning)
        torch.manual_seed(0)
        lin = native.MXLinear(64, 96, bias=True, recipe="mxfp4_all", backend="triton",
                              method="bf16").to(device)
        xx = x.to(torch.bfloat16).requires_grad_(x_grad)
        y = lin(xx)
        y.backward(gy.to(torch.bfloat16))
        out = [y, lin.weight.grad, lin.bias.grad] + ([xx.grad] if x_grad else [])
        with torch.no_grad():
            out.append(lin(xx))
        return [t.detach().float().cpu().numpy().view(np.int32) for t in out]
    for x_grad, want_calls in ((True, 2), (False, 1)):
        calls.clear()
        want = run(False, x_grad)
        assert not calls
        got = run(True, x_grad)
        assert len(calls) == want_calls, x_grad
        for g, w in zip(got, want):
            assert np.array_equal(g, w), x_grad

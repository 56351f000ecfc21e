"""``ocpmx.native.fastlaunch``: the launch through a cached compiled kernel must pick the kernel
Triton would pick. The key is checked against Triton's own specialization (``specialize_impl``,
an independent reference) and the argument order against Python's binding of the kernel's
signature; on a GPU, launches through both paths give the same bits, misaligned and odd-sized
operands included."""
import inspect
import itertools

import pytest
import torch

from ocpmx import native
from ocpmx.native import fastlaunch, launch
from ocpmx.native._lazy import kernels

try:
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction, native_specialize_impl
except ImportError:  # pragma: no cover - Triton < 3.4 binds in Python
    native_specialize_impl = None

GPU = torch.cuda.is_available()


def _triton_spec(a):
    return native_specialize_impl(BaseBackend, a, False, True, True)


ARGS = [1, 2, 15, 16, 17, 32, 0, -16, -17, 2**31 - 16, 2**31, 2**32 + 1, 2**63 - 1, 2**63,
        2**64 - 16, True, False, 0.25, 1.0, None,
        torch.zeros(8), torch.zeros(9)[1:], torch.zeros(8, dtype=torch.bfloat16),
        torch.zeros(16, dtype=torch.uint8)[8:], torch.zeros(16, dtype=torch.uint8)[3:],
        torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int16)]


@pytest.mark.skipif(native_specialize_impl is None, reason="Triton without specialize_impl")
def test_key_separates_what_triton_specializes():
    """Any two arguments Triton compiles differently for get different keys (the key may be
    finer, never coarser)."""
    for a, b in itertools.combinations(ARGS, 2):
        if _triton_spec(a) != _triton_spec(b):
            assert fastlaunch.arg_key(a) != fastlaunch.arg_key(b), (a, b)
    # and it is not the trivial key: equal specializations share one where Triton's do
    assert fastlaunch.arg_key(2) == fastlaunch.arg_key(3)
    assert fastlaunch.arg_key(torch.zeros(8)) == fastlaunch.arg_key(torch.ones(4))


def _descriptors():
    """Gluon's host TMA descriptors over CPU tensors (building one needs no GPU): shapes,
    offsets and dtypes, blocks and layouts."""
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    def desc(rows, cols, block, dtype=torch.float8_e4m3fn, gtype=None, off=0, swizzle=None):
        gtype = gtype or gl.float8e4nv
        t = torch.zeros(rows * cols + off, dtype=dtype)[off:].view(rows, cols)
        layout = gl.NVMMASharedLayout.get_default_for(block, gtype) if swizzle is None else \
            gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=8, rank=2)
        return TensorDescriptor.from_tensor(t, block, layout)
    return [desc(256, 256, [128, 128]), desc(8192, 4096, [128, 128]),
            desc(200, 2048, [128, 128], off=16), desc(256, 256, [64, 128]),
            desc(256, 256, [128, 64]), desc(256, 256, [128, 128], swizzle=64),
            desc(256, 256, [64, 64], torch.int16, gl.int16)]


@pytest.mark.skipif(native_specialize_impl is None, reason="Triton without specialize_impl")
def test_key_of_tma_descriptors_follows_triton():
    """Host TMA descriptors (the Gluon folded GEMM's arguments): descriptors Triton compiles
    differently for (element type, block, layout) get different keys, and those it compiles
    alike share one whatever their shapes and addresses (the launcher encodes those each
    launch); a launch over descriptors of CPU tensors is left to Triton."""
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper")
    descs = _descriptors()
    for a, b in itertools.combinations(descs, 2):
        same = _triton_spec(a) == _triton_spec(b)
        assert (fastlaunch.arg_key(a) == fastlaunch.arg_key(b)) == same, (a, b)
    assert fastlaunch.arg_key(descs[0]) == fastlaunch.arg_key(descs[2])  # not trivial
    assert fastlaunch.arg_key(descs[0]) != fastlaunch.arg_key(torch.zeros(8))
    n0 = fastlaunch.STATS.other
    from ocpmx.native.kernels import fold_wgmma
    assert fastlaunch.launch(fold_wgmma.folded_gemm_wgmma_kernel, (1,), tuple(descs[:5]),
                             {}) is None  # CPU: Triton's path (which would refuse it)
    assert fastlaunch.STATS.other == n0 + 1


def test_key_refuses_other_kinds():
    for a in ("x", (1, 2), [1], 1 + 2j, object()):
        assert fastlaunch.arg_key(a) is fastlaunch._EMPTY


def _jit(kernel):
    """A ``JITFunction`` of a kernel module's function, also where the interpreter runs them."""
    fn = getattr(kernel, "fn", kernel)
    while hasattr(fn, "fn"):
        fn = fn.fn
    return JITFunction(fn)


def test_bound_follows_the_signature():
    """The full argument list (positional, named constexprs, defaults) is Python's binding of
    the kernel's signature, for the row kernel's 44 parameters."""
    jit = _jit(kernels.quantize.quantize_rows32_kernel)
    sig = fastlaunch._signature_of(jit)
    n = native.ops.numerics("e2m1", rotation="hadamard16")
    consts, _ = launch.rows32_constexprs(n, torch.bfloat16, 1 << 10, native.default_tuning(),
                                         False, torch.device("cpu"))
    consts = {k: v for k, v in consts.items() if k in sig[0]}  # no launch options
    args = tuple(range(12))
    ref = inspect.signature(jit.fn).bind(*args, **consts)
    ref.apply_defaults()
    assert fastlaunch.bound(sig, args, consts) == list(ref.arguments.values())
    assert fastlaunch.bound(sig, args[:-1], consts) is None  # a parameter missing
    assert fastlaunch.bound(sig, args[:-1], {**consts, "n_rows": 3}) is None  # runtime by name


def test_interpreter_and_cpu_tensors_take_triton_path():
    n0 = fastlaunch.STATS.other
    x = torch.randn(4, 64)
    if native.interpreting():
        q = native.quantize(x, "e2m1", backend="triton")
        assert q.data.shape == (4, 32)
        assert fastlaunch.STATS.other > n0
    assert fastlaunch.signature(object()) is None


@pytest.mark.skipif(not GPU, reason="needs a GPU: the fast path launches compiled kernels")
@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("rounding", ["rne", "stochastic"])
def test_fast_launch_same_bits_gpu(axis, rounding, monkeypatch):
    """Quantize, quantize_dequantize and dequantize through the cached kernels give the bits of
    Triton's own launch, and the second call does take the cached path; a misaligned input
    and an odd row count get their own specializations."""
    base = torch.randn(3 * 64 * 96 + 1, device="cuda")
    cases = [base[:64 * 96].view(64, 96).bfloat16(), base[1:1 + 64 * 96].view(64, 96),
             base[:3 * 64 * 96].view(3, 64, 96)[:, :33].contiguous()]
    kw = dict(rotation="hadamard16", rounding=rounding, seed=7, axis=axis)

    def run_all():
        out = []
        for x in cases:
            if axis == 0 and x.shape[0] % 32:
                continue
            q = native.quantize(x, "e2m1", **kw)
            out += [q.data.clone(), q.scales.clone(),
                    native.quantize_dequantize(x, "e4m3", **kw).view(torch.int16).clone(),
                    native.dequantize(q, torch.bfloat16).view(torch.int16).clone()]
        torch.cuda.synchronize()
        return out

    monkeypatch.setattr(fastlaunch, "ENABLED", False)
    ref = run_all()
    monkeypatch.setattr(fastlaunch, "ENABLED", True)
    run_all()  # first launches of each specialization: through Triton, cached
    fast0 = fastlaunch.STATS.fast
    got = run_all()
    assert fastlaunch.STATS.fast > fast0
    for r, g in zip(ref, got, strict=True):
        assert torch.equal(r, g)


def test_direct_call_passes_what_triton_passes(monkeypatch):
    """``fastlaunch.call`` hands Triton's launcher of a compiled kernel the arguments that
    ``CompiledKernel[grid](*args, stream=...)`` of the installed Triton hands it, except the
    launch metadata and the two hook chains, which it passes as None where the chains are empty
    (Triton's launcher then calls no hook); with a hook set it goes through Triton's own
    ``__getitem__``. Checked against Triton's method run on a stand-in kernel."""
    from triton import knobs
    from triton.compiler.compiler import CompiledKernel

    class Kernel:
        function, packed_metadata, name, src = "fn-handle", ("packed",), "k", None

        def __init__(self):
            self.calls = []
            self.run = lambda *a: self.calls.append(a)

        def _init_handles(self):
            pass
        launch_metadata = CompiledKernel.launch_metadata
        __getitem__ = CompiledKernel.__getitem__

    args = (torch.zeros(4), 7, 0.5, True, None)
    ref, got = Kernel(), Kernel()
    ref[(3, 2, 1)](*args, stream=1234)
    fastlaunch._DIRECT.clear()
    fastlaunch.call(got, (3, 2, 1), args, 1234)
    (r,), (g,) = ref.calls, got.calls
    assert g[:6] == r[:6] == (3, 2, 1, 1234, "fn-handle", ("packed",))
    assert g[6:9] == (None, None, None)
    assert r[7] is knobs.runtime.launch_enter_hook and r[8] is knobs.runtime.launch_exit_hook
    assert not r[7].calls and not r[8].calls  # the chains Triton passes are empty
    assert g[9:] == r[9:] and g[9] is args[0]
    hooked = Kernel()
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda metadata: None)
    fastlaunch.call(hooked, (3, 2, 1), args, 1234)
    assert hooked.calls[0][7] is knobs.runtime.launch_enter_hook  # through __getitem__
    monkeypatch.undo()
    monkeypatch.setattr(fastlaunch, "DIRECT", False)  # (OCPMX_DIRECT_LAUNCH=0)
    fastlaunch.call(hooked, (3, 2, 1), args, 1234)
    assert hooked.calls[1][7] is knobs.runtime.launch_enter_hook
    fastlaunch._DIRECT.clear()


def test_direct_call_on_triton_36_calls_its_c_launcher(monkeypatch):
    """Under Triton 3.6 (the GPU hosts'), whose ``CudaLauncher.__call__(gridX, gridY, gridZ,
    stream, function, *args)`` allocates the scratch buffers a kernel asks for and passes the
    C launcher grid, stream, function, its cooperative-grid and PDL flags, the two buffers and
    the rest, ``fastlaunch.call`` calls that C launcher with the same arguments for a kernel
    that asks for no scratch; with scratch, under another Triton, or with AMD's launcher
    (same parameters, another order), it calls the launcher."""
    import triton

    class Launcher:  # the shape of Triton 3.6's CudaLauncher
        launch_cooperative_grid, launch_pdl, profile_scratch_size = False, True, 0

        def __init__(self, scratch):
            self.global_scratch_size, self.calls = scratch, []
            self.launch = lambda *a: self.calls.append(a)

        def __call__(self, gridX, gridY, gridZ, stream, function, *args):
            self.calls.append("launcher")
            buffer = "scratch" if self.global_scratch_size else None
            self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid,
                        self.launch_pdl, buffer, None, *args)

    Launcher.__name__, Launcher.__module__ = "CudaLauncher", "triton.backends.nvidia.driver"

    class HIPLauncher(Launcher):  # (3.6's AMD launcher: the same parameters, another order)
        pass
    HIPLauncher.__module__ = "triton.backends.amd.driver"

    class Kernel:
        function, packed_metadata = "fn-handle", ("packed",)

        def __init__(self, scratch=0, launcher=Launcher):
            self.run = launcher(scratch)

    args = (torch.zeros(4), 7, 0.5, None)
    want = Kernel()
    want.run(3, 2, 1, 1234, "fn-handle", ("packed",), None, None, None, *args)
    assert want.run.calls[0] == "launcher"
    for version, scratch, launcher, through_launcher in (
            ("3.6.0", 0, Launcher, False), ("3.6.0", 64, Launcher, True),
            ("3.9.0", 0, Launcher, True), ("3.6.0", 0, HIPLauncher, True)):
        monkeypatch.setattr(triton, "__version__", version)
        fastlaunch._DIRECT.clear()
        got = Kernel(scratch, launcher)
        fastlaunch.call(got, (3, 2, 1), args, 1234)
        assert (got.run.calls[0] == "launcher") == through_launcher
        c_call = got.run.calls[-1]
        assert c_call[:7] + c_call[8:] == want.run.calls[1][:7] + want.run.calls[1][8:]
        assert c_call[7] == ("scratch" if scratch else None)
    fastlaunch._DIRECT.clear()

"""Kernel launches without Triton's per-call argument binding.

``kernel[grid](*args, **constexprs)`` binds every argument, builds a specialization entry for
each (constexprs included: the quantize kernels have about 40) and hashes them all to find the
compiled kernel: 60-90 us of host time a launch on an H100 host (``gpu_bench.py host``), more
than a whole quantize pass of a 30m model's activations takes on the GPU. Here the first launch
of each specialization goes through Triton (which compiles, caches and launches) and keeps the
``CompiledKernel`` it returns; later launches of the same specialization call it directly
(``CompiledKernel[grid](*args, stream=...)``, Triton's own launcher of a compiled kernel).

The specialization key holds everything Triton's binder specializes on (``specialize_impl`` in
Triton 3.x), a superset where in doubt: each tensor's dtype and 16-byte alignment, each
integer's equality to 1, divisibility by 16 and width (i32, i64, u64), the Python type of every
other argument, the device, and every constexpr and launch option by value. A finer key only
costs a compile more, never a wrong kernel; the bits are the kernel's either way (the GPU tests
compare the two paths, ``tests/test_fastlaunch.py``).

Only plain ``triton.jit`` (and Gluon) kernels on CUDA/ROCm tensors and host TMA descriptors of
them take this path (a descriptor's tensor map is encoded at each launch, by the launcher
Triton wraps for that); the interpreter, an autotuned kernel and any argument of another kind
go through ``kernel[grid]``. Launch hooks (a profiler's) are called either way: the compiled
kernel's launcher calls them. ``OCPMX_FAST_LAUNCH=0`` turns it off.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

ENABLED = os.environ.get("OCPMX_FAST_LAUNCH", "1") != "0"
DIRECT = os.environ.get("OCPMX_DIRECT_LAUNCH", "1") != "0"  # ``call``'s direct launcher call


@dataclass
class Stats:
    """Launch counts since import (or ``clear``): ``fast`` through a cached compiled kernel,
    ``first`` through Triton then cached, ``other`` through Triton alone."""
    fast: int = 0
    first: int = 0
    other: int = 0
    entries: dict = field(default_factory=dict, repr=False)


STATS = Stats()
_SIGNATURES: dict = {}  # kernel -> (param names, defaults) or None (not ours to launch)
_EMPTY = object()


def clear() -> None:
    """Forget every cached compiled kernel and reset the counts."""
    STATS.fast = STATS.first = STATS.other = 0
    STATS.entries.clear()
    _SIGNATURES.clear()
    _DIRECT.clear()


_TENSOR = torch.Tensor


def _is_descriptor(t: type) -> bool:
    """Whether ``t`` is one of Triton's host TMA descriptor classes (``triton.tools.
    tensor_descriptor.TensorDescriptor``, Gluon's ``...nvidia.hopper.TensorDescriptor``)."""
    return t.__name__ == "TensorDescriptor" and t.__module__.startswith("triton.")


def arg_key(a):
    """The specialization of one runtime argument, or ``_EMPTY`` for a kind not handled here:
    a tensor's dtype and 16-byte alignment; an integer's equality to 1 (then Triton makes it a
    constant), divisibility by 16 and type (i32, i64 or u64 by range); a host TMA descriptor's
    class, element type, block shape, shared-memory layout and padding (Triton specializes on
    its type ``tensordesc<dtype[block], layout>``: shapes, strides and the address travel at
    launch in the descriptor the launcher encodes); the type of the rest."""
    t = type(a)
    if t is _TENSOR or (t is not bool and t is not int and isinstance(a, _TENSOR)):
        return (a.dtype, a.data_ptr() & 15 == 0)
    if _is_descriptor(t):
        return (t, a.base.dtype, tuple(a.block_shape), getattr(a, "layout", None),
                getattr(a, "padding", None), getattr(a, "round_f32_to_tf32", None))
    if t is int:
        return (a == 1, a & 15 == 0, -0x80000000 <= a < 0x80000000, a >= 1 << 63)
    if t is bool:
        return "u1"
    if t is float:
        return "fp32"
    if a is None:
        return None
    return _EMPTY


def signature(kernel):
    """(parameter names, their defaults or ``_EMPTY``, the names of the runtime parameters) of
    a plain ``triton.jit`` kernel, or None where this module does not launch it."""
    sig = _SIGNATURES.get(kernel, _EMPTY)
    if sig is _EMPTY:
        sig = None
        try:
            from triton.runtime.jit import JITFunction
            from .dispatch import interpreting
            if isinstance(kernel, JITFunction) and not interpreting():
                sig = _signature_of(kernel)
        except (ImportError, AttributeError):  # another Triton: its own launch path
            sig = None
        _SIGNATURES[kernel] = sig
    return sig


def _signature_of(kernel) -> tuple:
    params = kernel.params
    return (tuple(p.name for p in params),
            tuple(p.default if p.has_default else _EMPTY for p in params),
            frozenset(p.name for p in params if not p.is_constexpr))


def bound(sig, args: tuple, constexprs: dict) -> list | None:
    """All parameters in order, as Triton binds them (positional, then by name, then the
    defaults), or None if one is missing or a runtime parameter is passed by name (its value
    would be frozen into the cached tail)."""
    names, defaults, runtime = sig
    if not runtime.isdisjoint(constexprs):
        return None
    full = list(args)
    for name, default in zip(names[len(args):], defaults[len(args):]):
        v = constexprs.get(name, default)
        if v is _EMPTY:
            return None
        full.append(v)
    return full


def launch(kernel, grid, args: tuple, constexprs: dict):
    """Launch through a cached compiled kernel; returns it, or None where the caller must
    launch through Triton (``kernel[grid]``)."""
    sig = signature(kernel)
    first = args[0] if args else None
    if first is not None and _is_descriptor(type(first)):
        first = first.base  # (the Gluon folded GEMM's first argument)
    if sig is None or not isinstance(first, torch.Tensor) or first.device.type != "cuda":
        STATS.other += 1
        return None
    device = torch.cuda.current_device()  # where Triton launches (and so here)
    specs = tuple(map(arg_key, args))
    if _EMPTY in specs:
        STATS.other += 1
        return None
    try:
        key = (kernel, device, specs, tuple(constexprs), tuple(constexprs.values()))
        entry = STATS.entries.get(key)
    except TypeError:  # an unhashable constexpr
        STATS.other += 1
        return None
    if entry is None:
        out = kernel[grid](*args, **constexprs)
        tail = bound(sig, args, constexprs)
        if _launchable(out) and tail is not None:
            # the parameters after the positional ones: fixed by the key (constexprs, defaults)
            STATS.entries[key] = (out, tuple(tail[len(args):]))
            STATS.first += 1
        else:
            STATS.other += 1
        return out
    compiled, tail = entry
    if callable(grid):
        grid = grid(dict(zip(sig[0], (*args, *tail))))
    g = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
    call(compiled, g, (*args, *tail), torch._C._cuda_getCurrentRawStream(device))
    STATS.fast += 1
    return compiled


_DIRECT: dict = {}  # compiled kernel -> (launcher, its leading arguments) or None
_RUNTIME_KNOBS = None


def _no_launch_hooks() -> bool:
    """Whether no launch hook (a profiler's) is set in Triton."""
    global _RUNTIME_KNOBS
    if _RUNTIME_KNOBS is None:
        from triton import knobs
        _RUNTIME_KNOBS = knobs.runtime
    enter, leave = _RUNTIME_KNOBS.launch_enter_hook, _RUNTIME_KNOBS.launch_exit_hook
    # (a HookChain with no calls, or None in older Triton; a plain function is a hook)
    return (enter is None or not getattr(enter, "calls", True)) and \
        (leave is None or not getattr(leave, "calls", True))


# The parameters of Triton 3.6's ``CudaLauncher.__call__``, which allocates the scratch buffers
# a kernel asks for (none, for the kernels here) and passes its own fields and the rest to the
# C launcher ``CudaLauncher.launch`` in this order: grid, stream, function, cooperative-grid
# and PDL flags, the two scratch buffers, the arguments. (3.6's ``HIPLauncher.__call__`` has the
# same parameters and another order: only NVIDIA's launcher is taken apart.)
_LAUNCHER_36 = ("self", "gridX", "gridY", "gridZ", "stream", "function", "args")


def _direct(compiled):
    """(launcher, the arguments it takes between the stream and the kernel's) of a compiled
    kernel, or None where it has no launcher to call directly. Where its launcher is Triton
    3.6's ``CudaLauncher`` and the kernel takes no scratch memory: that launcher's C function
    (``_LAUNCHER_36``), which skips a Python frame that repacks ~55 arguments; elsewhere the
    launcher itself."""
    try:
        run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    except AttributeError:
        return None
    if function is None:  # (handles not loaded yet: not kept, asked again next launch)
        return _EMPTY
    try:
        import inspect
        import triton
        kind = type(run)
        if triton.__version__.startswith("3.6.") and kind.__name__ == "CudaLauncher" and \
                kind.__module__ == "triton.backends.nvidia.driver" and \
                tuple(inspect.signature(kind.__call__).parameters) == _LAUNCHER_36 and \
                not run.global_scratch_size and not run.profile_scratch_size:
            return run.launch, (function, run.launch_cooperative_grid, run.launch_pdl, None,
                                None, packed, None, None, None)
    except (AttributeError, TypeError, ValueError, ImportError):
        pass
    return run, (function, packed, None, None, None)


def takes_addresses(compiled) -> bool:
    """Whether ``compiled`` (what a launch returned) takes a pointer argument as an integer
    address as well as a tensor: Triton's compiled kernels do (their launcher checks a
    tensor's pointer with the driver and takes an integer as it is)."""
    return _launchable(compiled)


def call(compiled, grid: tuple, args: tuple, stream) -> None:
    """``compiled[grid](*args, stream=stream)`` for a 3-dimensional ``grid`` and every
    parameter in order (``args``). Where no launch hook is set, Triton's launcher of the
    compiled kernel (``_direct``) is called directly with no launch metadata and no hooks,
    which is what ``CompiledKernel[grid]`` passes it then apart from an empty hook chain called
    twice and a metadata object built each launch; that Python is skipped. Elsewhere (hooks
    set, or a compiled kernel without the launcher Triton 3.x has, ``DIRECT`` off:
    ``OCPMX_DIRECT_LAUNCH=0``) through ``compiled[grid]``."""
    direct = _DIRECT.get(compiled, _EMPTY)
    if direct is _EMPTY:
        direct = _direct(compiled)
        if direct is not _EMPTY:
            _DIRECT[compiled] = direct
        else:
            direct = None
    if direct is not None and DIRECT and _no_launch_hooks():
        launcher, lead = direct
        launcher(grid[0], grid[1], grid[2], stream, *lead, *args)
    else:
        compiled[grid](*args, stream=stream)


def cached_tail(kernel, args: tuple, constexprs: dict) -> tuple | None:
    """The parameters after the positional ``args`` as a cached launch passes them (the
    constexprs and defaults, in order), or None where this module would not cache the launch
    (``native.plans`` keeps them beside the compiled kernel a launch returned)."""
    sig = signature(kernel)
    full = bound(sig, args, constexprs) if sig is not None else None
    return None if full is None else tuple(full[len(args):])


def compiled(out) -> bool:
    """Whether a launch returned a compiled kernel (one a later launch may call directly)."""
    return _launchable(out)


def _launchable(out) -> bool:
    try:
        from triton.compiler import CompiledKernel
    except ImportError:
        return False
    return isinstance(out, CompiledKernel)

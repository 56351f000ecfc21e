"""torch.compile over MXLinear: the MX operations are ``torch.library`` custom ops, so a Llama
block compiles whole (no graph break) for every recipe, and gives the same bits as eager mode.

Bit equality is checked with ``backend="aot_eager"`` (Dynamo and AOT autograd, every op run by
its eager kernel): Inductor fuses and reorders the block's other operations (RMSNorm, SiLU,
attention), which changes their bits even in the bf16 recipe, so with Inductor the check is the
graph count and the bits of an MXLinear alone (whose operations are the opaque custom ops).
Random bits (stochastic rounding, re-drawn signs) come from each layer's key buffer, so a new
step changes the bits without a recompile.

The per-recipe test runs the CPU implementation of the custom ops (the emulator backend): the
graph is the same whatever runs inside the ops, and the Triton kernels under compile, keys read
through pointers, are covered through the interpreter by
``test_triton_interpreter_path_compiles_with_eager_bits`` (random signs), the Inductor test
(stochastic rounding) and tests/test_gfx950_soft.py (gfx950's conversion).
"""
import pytest
import torch

from ocpmx import native
from ocpmx.llama_train.model import Block, get_config, rope_frequencies

# fp8 is the hand-written per-tensor baseline (to be replaced by torchao.float8): compiled, its
# block gave FP8-sized differences from eager (not understood), so MXLinear refuses compilation
# with it (test_fp8_baseline_refuses_compilation)
RECIPES = [r for r in native.RECIPES if r != "fp8"]


def as_bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


def block_and_inputs(recipe: str, backend=None):
    torch.manual_seed(0)
    cfg = get_config("tiny")
    blk = Block(cfg)
    native.convert_linears(blk, recipe, seed=3, backend=backend)
    x = torch.randn(2, 32, cfg.dim)
    return blk, x, rope_frequencies(cfg, 32)


def step(blk, fn, x, freqs, step_no):
    """Forward and backward under bf16 autocast, as training runs them; the outputs, the input
    gradient and every parameter gradient."""
    native.set_step(blk, step_no)
    blk.zero_grad(set_to_none=True)
    xx = x.clone().requires_grad_()
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        y = fn(xx, freqs)
    y.float().square().sum().backward()
    return [y.detach(), xx.grad] + [p.grad.clone() for p in blk.parameters()]


def frames_compiled() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("recipe", RECIPES)
def test_block_compiles_whole_with_eager_bits(recipe):
    torch._dynamo.reset()
    blk, x, freqs = block_and_inputs(recipe, backend="emulator")
    explanation = torch._dynamo.explain(blk)(x, freqs)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    torch._dynamo.reset()
    compiled = torch.compile(blk, fullgraph=True, backend="aot_eager")
    eager = [step(blk, blk, x, freqs, s) for s in (1, 2)]
    before = frames_compiled()
    got = [step(blk, compiled, x, freqs, s) for s in (1, 2)]
    assert frames_compiled() - before == 1, "a new step recompiled the block"
    for e_step, c_step in zip(eager, got):
        for e, c in zip(e_step, c_step):
            assert torch.equal(as_bits(e), as_bits(c))
    # the random-bit recipes differ between steps: the keys reached the compiled graph
    if blk.attention.wq.keyed:
        assert not all(torch.equal(a, b) for a, b in zip(got[0][2:], got[1][2:]))


def test_mxlinear_compiles_whole_where_dynamo_cannot_trace_the_autocast_query(monkeypatch):
    """PyTorch 2.11's Dynamo (the GPU hosts') cannot trace ``torch.amp.is_autocast_available``.
    MXLinear.forward called it (bdff929), the graph broke there, and tracing the autograd
    function after the break failed: every compiled training run stopped at its first step
    until 27b37ee. CI's PyTorch traces the builtin, so here it is made untraceable: MXLinear
    must still compile whole, under autocast and without."""
    monkeypatch.setattr(torch.amp, "is_autocast_available",
                        torch.compiler.disable(torch.amp.is_autocast_available))
    torch._dynamo.reset()
    torch.manual_seed(0)
    lin = native.MXLinear(64, 32, recipe="mxfp4_all", backend="emulator")
    x = torch.randn(32, 64)
    compiled = torch.compile(lin, fullgraph=True, backend="aot_eager")
    for autocast in (True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            got, want = compiled(x), lin(x)
        assert got.dtype == want.dtype == (torch.bfloat16 if autocast else torch.float32)
        assert torch.equal(as_bits(got), as_bits(want))


def test_fp8_baseline_refuses_compilation():
    torch._dynamo.reset()
    blk, x, freqs = block_and_inputs("fp8")
    step(blk, blk, x, freqs, 1)  # eager runs
    with pytest.raises(Exception, match="per-tensor FP8 baseline gives other numbers"):
        torch.compile(blk, fullgraph=True, backend="aot_eager")(x, freqs)


def test_inductor_compiles_the_block_and_keeps_the_mx_bits():
    """Inductor: the block compiles whole; an MXLinear alone (custom ops and views only, no bias:
    its gradient is a torch reduction, which Inductor orders its own way) keeps its eager bits,
    forward and backward, stochastic rounding included."""
    torch._dynamo.reset()
    blk, x, freqs = block_and_inputs("mxfp4_all_h16")
    compiled = torch.compile(blk, fullgraph=True)
    step(blk, compiled, x, freqs, 1)
    assert torch._dynamo.explain(blk)(x, freqs).graph_break_count == 0
    torch._dynamo.reset()
    torch.manual_seed(1)
    lin = native.MXLinear(64, 96, bias=False, recipe="mxfp4_all_sr_wgrad", seed=5)
    x2 = torch.randn(2, 32, 64)
    gy = torch.randn(2, 32, 96)
    comp = torch.compile(lin, fullgraph=True)

    def run(fn, s):
        native.set_step(lin, s)
        lin.zero_grad(set_to_none=True)
        xx = x2.clone().requires_grad_()
        y = fn(xx)
        y.backward(gy)
        return y.detach(), xx.grad, lin.weight.grad.clone()

    for s in (3, 4):
        for e, c in zip(run(lin, s), run(comp, s)):
            assert torch.equal(e, c)


@pytest.mark.skipif(not native.interpreting(), reason="the Triton backend on CPU tensors is the "
                    "interpreter (TRITON_INTERPRET=1, set by conftest.py without a GPU)")
def test_triton_interpreter_path_compiles_with_eager_bits():
    """The Triton backend (the CPU interpreter here) under compile: the kernels read the
    per-step keys through pointers."""
    torch._dynamo.reset()
    blk, x, freqs = block_and_inputs("mxfp4_all_rht_wgrad", backend="triton")
    blk = blk.to(torch.float32)
    compiled = torch.compile(blk, fullgraph=True, backend="aot_eager")
    for s in (1, 2):
        for e, c in zip(step(blk, blk, x, freqs, s), step(blk, compiled, x, freqs, s)):
            assert torch.equal(as_bits(e), as_bits(c))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("recipe", ["mxfp4_all_h16", "mxfp4_all_sr_wgrad", "mxfp4_all_rht_wgrad"])
def test_training_step_replays_from_a_cuda_graph(recipe):
    """Forward and backward of a block captured once in a CUDA graph, replayed for two steps
    (set_step writes the keys in between): the same bits as eager steps of a twin block."""
    cfg = get_config("tiny")

    def make():
        torch.manual_seed(0)
        blk = Block(cfg).cuda()
        native.convert_linears(blk, recipe, seed=3)
        return blk

    blk, twin = make(), make()
    x = torch.randn(2, 32, cfg.dim, device="cuda")
    freqs = rope_frequencies(cfg, 32, "cuda")
    static_x = x.clone().requires_grad_()

    def fwd_bwd():
        static_x.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = blk(static_x, freqs)
        y.float().square().sum().backward()
        return y

    for p in blk.parameters():
        p.grad = torch.zeros_like(p)
    native.set_step(blk, 0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm up (compiles the kernels) outside the capture
            for p in blk.parameters():
                p.grad.zero_()
            fwd_bwd()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    for p in blk.parameters():
        p.grad.zero_()
    with torch.cuda.graph(g):
        y_static = fwd_bwd()
    grads = [p.grad for p in blk.parameters()]  # the graph's buffers (it accumulates into them)
    for step_no in (5, 6):
        native.set_step(blk, step_no)
        for t in grads:
            t.zero_()
        g.replay()
        torch.cuda.synchronize()
        # the twin, eagerly, accumulating into zeroed gradients too (0 + (-0) is +0)
        native.set_step(twin, step_no)
        for p in twin.parameters():
            p.grad = torch.zeros_like(p)
        xx = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = twin(xx, freqs)
        y.float().square().sum().backward()
        for e, r in zip([y] + [p.grad for p in twin.parameters()], [y_static] + grads):
            assert torch.equal(as_bits(e.detach()), as_bits(r))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("recipe", ["mxfp4_all_h16", "mxfp4_wgrad_rht", "mxfp4_all_sr_wgrad"])
def test_reduce_overhead_block_matches_default_compile_step_by_step(recipe):
    """A block compiled with mode="reduce-overhead" (Inductor's CUDA graph trees: a warm-up
    call, a recording, then replays) against its twin compiled with the default mode, both
    under Inductor's deterministic mode, five steps of two micro-batches each, set_step before
    every micro-batch as training calls it, the weights fixed: every step's outputs and every
    MXLinear weight's accumulated gradient carry the same bits. A replay that read a stale key
    (the random signs or rounding bits of an earlier step or micro-batch) differs from its step
    on. The RMSNorm weights' gradients are Inductor's own reductions, which the two
    compilations may sum differently (on an H100, 2026-11-26: 39 elements of
    ``attention_norm.weight.grad`` apart in ``mxfp4_all_h16`` at step 0, deterministic mode
    and all): held to 1e-5 relative (passed in this form on an H100 at fe42744,
    results/native_gpu/pytest_serial_compile_h100.log)."""
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters
    cfg = get_config("tiny")

    def make():
        torch.manual_seed(0)
        blk = Block(cfg).cuda()
        native.convert_linears(blk, recipe, seed=3, backend="triton")
        return blk

    blk, twin = make(), make()
    freqs = rope_frequencies(cfg, 32, "cuda")
    gen = torch.Generator(device="cuda").manual_seed(1)
    xs = [[torch.randn(2, 32, cfg.dim, device="cuda", generator=gen) for _ in range(2)]
          for _ in range(5)]
    torch._dynamo.reset()
    counters.clear()
    with inductor_config.patch(deterministic=True):
        graphs = torch.compile(blk, mode="reduce-overhead")
        plain = torch.compile(twin)

        def run(model, fn, step_no, mark):
            outs = []
            for micro, x in enumerate(xs[step_no]):
                native.set_step(model, step_no, micro)
                if mark and micro == 0:
                    torch.compiler.cudagraph_mark_step_begin()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    y = fn(x, freqs)
                y.float().square().sum().backward()
                outs.append(y.detach().clone())
            grads = [p.grad.clone() for p in model.parameters()]
            model.zero_grad(set_to_none=True)
            return outs, grads

        mx = {f"{n}.weight" for n, m in blk.named_modules() if isinstance(m, native.MXLinear)}
        names = [n for n, _ in blk.named_parameters()]
        assert len(mx) == 7 and len(names) == 9  # the attention's and the MLP's; two norms
        for step_no in range(5):
            (ya, ga), (yb, gb) = run(blk, graphs, step_no, True), run(twin, plain, step_no, False)
            for micro, (a, b) in enumerate(zip(ya, yb)):
                assert torch.equal(as_bits(a), as_bits(b)), f"step {step_no} micro {micro}: y"
            for name, a, b in zip(names, ga, gb):
                if name in mx:
                    differ = int((as_bits(a) != as_bits(b)).sum())
                    assert differ == 0, f"step {step_no}: {name}.grad differs in {differ} elements"
                else:  # (near-zero sums: an absolute floor of 1e-6 of the largest)
                    torch.testing.assert_close(a, b, rtol=1e-5,
                                               atol=1e-6 * float(b.abs().max()),
                                               msg=f"step {step_no}: {name}")
    # the graphs were recorded and replayed, not skipped (Inductor skips them quietly)
    assert counters["inductor"]["cudagraph_skips"] == 0
    torch._dynamo.reset()


def test_ops_are_not_differentiable():
    """The ocpmx ops' outputs require no gradient, as the eager functions' do not (both read
    their input detached; MXLinear's autograd function differentiates around them): no
    autograd-fallback path that would backpropagate silently wrong."""
    from ocpmx.native import library
    x = torch.randn(4, 64, requires_grad=True)
    eager = native.quantize_dequantize(x, "e2m1", backend="emulator")
    op = library.quantize_dequantize_op(x, "e2m1", "floor", "rne", "none", 1, 32, 0, None,
                                        "emulator", "ocp")
    data, scales = library.quantize_op(x, "e2m1", "floor", "rne", "none", -127, 1, 32, 0, None,
                                       "emulator", "ocp")
    assert not eager.requires_grad and not op.requires_grad
    assert not data.requires_grad and not scales.requires_grad and op.grad_fn is None
    assert torch.equal(op.view(torch.int16), eager.view(torch.int16))

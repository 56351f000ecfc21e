"""MXLinear: per-GEMM recipes, checked against a reference built from the emulator's quantize
and a float64 matmul of the dequantized operands; the bf16 recipe against nn.Linear."""
import ml_dtypes
import numpy as np
import pytest
import torch
from torch import nn

from ocpmx import emulator, native
from ocpmx.native.linear import GemmContext, mix_seed, output_dtype
from ocpmx.native.recipes import FP8_ELEMENT, GEMMS, MX_ELEMENT, OPERANDS
from native_util import devices

# (device, backend, GEMM method): Triton with tl.dot_scaled and with quantize-dequantize + a
# bf16 GEMM (what chips without MX units run), and the emulator
BACKENDS = [(d, None, m) for d in devices() for m in ("dot_scaled", "bf16")] + \
    [("cpu", "emulator", "auto")]


def as_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor's values in its own type (bfloat16 as ml_dtypes')."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def ref_gemm(gemm, g, a, a_axis, b, b_axis, ctx):
    """(value, error bound) in float64 for one GEMM of a recipe, from independent parts:
    emulator quantize, float64 matmul, and the float32 accumulation bound (for FP8 on a GPU,
    Hopper's FP8 tensor-core accumulation, which keeps about 13 fraction bits: REFERENCE §3)."""
    u = 2.0**-13 if (g.precision == "fp8" and a.is_cuda) else 2.0**-23
    # gfx950's stochastic rounding reads the source's own type (rule 8 of emulator.gfx950)
    src = [as_numpy(t) if g.conversion == "gfx950" else None for t in (a, b)]
    a, b = a.detach().float().cpu().numpy(), b.detach().float().cpu().numpy()
    if g.precision == "bf16":
        da, db = [torch.from_numpy(t).bfloat16().double().numpy() for t in (a, b)]
    elif g.precision == "fp8":
        da, db = [(q.double() * s.double()).numpy() for q, s in (
            native.fp8_per_tensor(torch.from_numpy(t), FP8_ELEMENT[OPERANDS[gemm][j]])
            for j, t in enumerate((a, b)))]
    else:
        rot = GemmContext(**ctx).rotation(g, gemm)
        da, db = [emulator.dequantize(emulator.quantize(
            t if src[j] is None else src[j], MX_ELEMENT[g.precision], axis=axis,
            scale_rule=g.scale_rule, rounding=g.rounding[j],
            seed=mix_seed(ctx["seed"], 3, ctx["layer"], ctx["step"], ctx["micro"],
                          GEMMS.index(gemm), j), rotation=rot, conversion=g.conversion)
        ).astype(np.float64) for j, (t, axis) in enumerate(((a, a_axis), (b, b_axis)))]
    da = da if a_axis == 1 else da.T
    db = db if b_axis == 1 else db.T
    k = da.shape[1]
    return da @ db.T, (k * u) * (np.abs(da) @ np.abs(db).T)


def check(got, want, bound, out_rounding, what):
    got = got.detach().float().cpu().numpy().astype(np.float64)
    err = np.abs(got - want)
    ok = err <= bound + out_rounding * np.abs(want) + 1e-30
    assert ok.all(), f"{what}: {np.sum(~ok)} entries off, worst {np.max(err - bound)}"


@pytest.mark.parametrize("device,backend,method", BACKENDS)
@pytest.mark.parametrize("recipe", list(native.RECIPES))
def test_recipe_matches_reference(device, backend, method, recipe):
    torch.manual_seed(0)
    t, n_in, n_out = 64, 64, 96
    lin = native.MXLinear(n_in, n_out, recipe=recipe, layer_id=3, seed=11, backend=backend,
                          method=method, device=device)
    native.set_step(lin, 7, micro=1)
    x = torch.randn(2, t // 2, n_in, dtype=torch.bfloat16, device=device, requires_grad=True)
    gy = torch.randn(2, t // 2, n_out, dtype=torch.bfloat16, device=device)
    y = lin(x)
    y.backward(gy)
    r = lin.recipe
    ctx = dict(seed=11, layer=3, step=7, micro=1)
    x2, gy2, w = x.detach().reshape(t, n_in), gy.reshape(t, n_out), lin.weight.detach()
    bf16 = 2.0**-8  # output rounding to bf16
    want, bound = ref_gemm("fprop", r.fprop, x2, 1, w, 1, ctx)
    bias = lin.bias.detach().float().cpu()
    if r.fprop.precision == "bf16":  # nn.Linear's computation: the bias is a bf16 operand too
        bias = bias.bfloat16().float()
    bias = bias.double().numpy()
    # two bf16 roundings at most: the GEMM output and the sum with the bias
    bound = bound + bf16 * (np.abs(want) + np.abs(bias))
    check(y.reshape(t, n_out), want + bias, bound, bf16, "fprop")
    want, bound = ref_gemm("dgrad", r.dgrad, gy2, 1, w, 0, ctx)
    check(x.grad.reshape(t, n_in), want, bound, bf16, "dgrad")
    want, bound = ref_gemm("wgrad", r.wgrad, gy2, 0, x2, 0, ctx)
    check(lin.weight.grad, want, bound, bf16 if r.wgrad.precision == "bf16" else 2.0**-24, "wgrad")
    assert lin.weight.grad.dtype == torch.float32 and y.dtype == torch.bfloat16
    assert torch.equal(lin.bias.grad, gy2.float().sum(0))


def test_bf16_recipe_equals_nn_linear():
    torch.manual_seed(1)
    ref = nn.Linear(64, 48, dtype=torch.bfloat16)
    lin = native.MXLinear(64, 48, recipe="bf16")
    with torch.no_grad():
        lin.weight.copy_(ref.weight.float())
        lin.bias.copy_(ref.bias.float())
    x = torch.randn(3, 32, 64, dtype=torch.bfloat16)
    gy = torch.randn(3, 32, 48, dtype=torch.bfloat16)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = ref(xa), lin(xb)
    assert torch.equal(ya, yb)
    ya.backward(gy)
    yb.backward(gy)
    assert torch.equal(xa.grad, xb.grad)
    assert torch.equal(ref.weight.grad, lin.weight.grad.bfloat16())
    assert torch.equal(lin.weight.grad.bfloat16().float(), lin.weight.grad)
    assert torch.equal(ref.bias.grad, lin.bias.grad.bfloat16())


def test_bf16_path_finite_differences():
    """Central differences of a loss linear in W and in x: exact up to bf16 rounding."""
    torch.manual_seed(2)
    lin = native.MXLinear(64, 32, recipe="bf16")
    x = torch.randn(32, 64, requires_grad=True)
    r = torch.randn(32, 32)
    (lin(x) * r).sum().backward()
    v, u = torch.randn_like(lin.weight), torch.randn_like(x)
    eps = 0.05
    with torch.no_grad():
        w0 = lin.weight.clone()
        lin.weight.copy_(w0 + eps * v)
        fp = (lin(x) * r).sum()
        lin.weight.copy_(w0 - eps * v)
        fm = (lin(x) * r).sum()
        lin.weight.copy_(w0)
        fd_w = (fp - fm) / (2 * eps)
        fd_x = ((lin(x + eps * u) * r).sum() - (lin(x - eps * u) * r).sum()) / (2 * eps)
    assert torch.allclose(fd_w, (lin.weight.grad * v).sum(), rtol=0.03)
    assert torch.allclose(fd_x, (x.grad * u).sum(), rtol=0.03)


def test_random_bits_follow_the_step():
    torch.manual_seed(3)
    x = torch.randn(64, 64, dtype=torch.bfloat16)
    gy = torch.randn(64, 32, dtype=torch.bfloat16)

    def wgrad(recipe, step):
        lin = native.MXLinear(64, 32, recipe=recipe, seed=5, backend="emulator")
        torch.manual_seed(4)
        nn.init.normal_(lin.weight)
        native.set_step(lin, step)
        lin(x).backward(gy)
        return lin.weight.grad

    for recipe in ("mxfp4_all_rht_wgrad", "mxfp4_all_sr_wgrad"):
        assert torch.equal(wgrad(recipe, 1), wgrad(recipe, 1))
        assert not torch.equal(wgrad(recipe, 1), wgrad(recipe, 2))
    for recipe in ("mxfp4_all_h16", "mxfp4_all_rht_fixed_wgrad", "mxfp4_all"):
        assert torch.equal(wgrad(recipe, 1), wgrad(recipe, 2))
    assert not torch.equal(wgrad("mxfp4_all_rht_fixed_wgrad", 1), wgrad("mxfp4_all_h16_wgrad", 1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host-device synchronization is a GPU matter")
@pytest.mark.parametrize("recipe", list(native.RECIPES))
def test_gpu_step_never_waits_for_the_device(recipe):
    """Forward + backward of every recipe queues work without a host-device synchronization
    (after a first call that compiles the kernels). A synchronization per quantize call made the
    random-sign arms 5x slower than the others when runs share a GPU (results/ablation)."""
    torch.manual_seed(6)
    lin = native.MXLinear(256, 128, recipe=recipe, seed=3, device="cuda")
    x = torch.randn(512, 256, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    gy = torch.randn(512, 128, dtype=torch.bfloat16, device="cuda")
    lin(x).backward(gy)
    torch.cuda.synchronize()
    native.set_step(lin, 1)
    torch.cuda.set_sync_debug_mode("error")
    try:
        lin(x).backward(gy)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()


def test_weight_cache_follows_updates():
    torch.manual_seed(5)
    lin = native.MXLinear(64, 32, recipe="mxfp4_all", backend="emulator")
    x = torch.randn(32, 64)
    y1 = lin(x)
    assert torch.equal(lin(x), y1)
    with torch.no_grad():
        lin.weight.mul_(2.0)
    y2 = lin(x)
    fresh = native.MXLinear(64, 32, recipe="mxfp4_all", backend="emulator")
    fresh.load_state_dict(lin.state_dict())
    assert torch.equal(y2, fresh(x)) and not torch.equal(y2, y1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.ModuleDict({"q": nn.Linear(64, 64), "o": nn.Linear(64, 64, bias=False)})
        self.mlp = nn.ModuleDict({"up": nn.Linear(64, 128)})
        self.output = nn.Linear(128, 40)  # 40 outputs: not MX-able along out-features


def test_converter_rules_and_shared_parameters():
    m = Block()
    params = {n: p for n, p in m.named_parameters()}
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    native.convert_linears(m, "mxfp4_all", rules=[("output", None), ("mlp.*", "mxfp4_fprop")],
                           seed=3)
    assert type(m.output) is nn.Linear
    assert isinstance(m.attn["q"], native.MXLinear) and m.attn["q"].recipe.name == "mxfp4_all"
    assert m.mlp["up"].recipe.name == "mxfp4_fprop" and m.attn["o"].bias is None
    assert [m.attn["q"].layer_id, m.attn["o"].layer_id, m.mlp["up"].layer_id] == [0, 1, 2]
    assert all(p is params[n] for n, p in m.named_parameters())
    x = torch.randn(32, 64)
    before = m.attn["q"].weight.clone()
    m.attn["q"](x).sum().backward()
    opt.step()
    assert not torch.equal(before, m.attn["q"].weight)
    with pytest.raises(ValueError, match="out_features = 40, not divisible"):
        native.convert_linears(Block(), "mxfp4_all")


def test_configuration_errors():
    with pytest.raises(ValueError, match="in_features = 48, not divisible by the MX block size"):
        native.MXLinear(48, 64, recipe="mxfp4_fprop")
    native.MXLinear(48, 64, recipe="bf16")  # no MX GEMM: any size
    with pytest.raises(ValueError, match="unknown recipe 'mxfp5'"):
        native.MXLinear(64, 64, recipe="mxfp5")
    lin = native.MXLinear(64, 64, recipe="mxfp4_all", backend="emulator")
    with pytest.raises(ValueError, match="20 tokens are not divisible by the block size 32"):
        lin(torch.randn(20, 64))
    with pytest.raises(ValueError,
                       match="stochastic rounding and the conversion apply to MX formats"):
        native.GemmRecipe("fp8", rotation="hadamard16")
    with pytest.raises(ValueError, match="unknown rotation"):
        native.GemmRecipe("mxfp4", rotation="hadamard64")


def test_recipe_table_names_the_studys_arms():
    arms = ["bf16", "fp8", "mxfp4_fprop", "mxfp4_fprop_dgrad", "mxfp4_all", "mxfp4_all_h16",
            "mxfp4_all_h16_wgrad", "mxfp4_all_sr_wgrad", "mxfp4_all_rht_wgrad",
            "mxfp4_all_rht_fixed_wgrad"]
    assert set(arms) <= set(native.RECIPES)
    h16 = native.RECIPES["mxfp4_all_h16"]
    assert all(h16.gemm(g).rotation == "hadamard16" and h16.gemm(g).precision == "mxfp4" for g in GEMMS)
    ladder = native.RECIPES["mxfp4_fprop_dgrad"]
    assert [ladder.gemm(g).precision for g in GEMMS] == ["mxfp4", "mxfp4", "bf16"]


# ---- issue 16: the Wgrad-only arms quantize exactly the operands they name -------------------

# What each arm's name promises, written out by hand (not read from the recipe table):
# {(GEMM, operand): (rounding, rotation[, conversion unless 'ocp'])} for every operand that is
# quantized; all others bf16.
WGRAD_ONLY = {
    "mxfp4_wgrad": {("wgrad", "dy"): ("rne", "none"), ("wgrad", "x"): ("rne", "none")},
    "mxfp4_wgrad_h16": {("wgrad", "dy"): ("rne", "hadamard16"),
                        ("wgrad", "x"): ("rne", "hadamard16")},
    "mxfp4_wgrad_rht": {("wgrad", "dy"): ("rne", "random_sign"),
                        ("wgrad", "x"): ("rne", "random_sign")},
    "mxfp4_wgrad_sr": {("wgrad", "dy"): ("stochastic", "none"), ("wgrad", "x"): ("rne", "none")},
    "mxfp4_wgrad_sr_gfx950": {("wgrad", "dy"): ("stochastic", "none", "gfx950"),
                              ("wgrad", "x"): ("rne", "none", "gfx950")},
    "mxfp4_all_sr_wgrad": {**{(g, o): ("rne", "none") for g in ("fprop", "dgrad")
                              for o in OPERANDS[g]},
                           ("wgrad", "dy"): ("stochastic", "none"),
                           ("wgrad", "x"): ("stochastic", "none")},
}


def quantized_operands(recipe, monkeypatch) -> dict:
    """Run one MXLinear forward and backward (emulator) with a spy on the quantizers that
    ``recipe_gemm`` calls; {(GEMM, operand): (rounding, rotation kind)} of every quantized
    operand. The operands have distinct (shape, axis) pairs, which name them: x (64, 96), W
    (160, 96), dY (64, 160); fprop along in-features (axis 1 of x and W), dgrad along
    out-features (axis 1 of dY, axis 0 of W), wgrad along tokens (axis 0 of dY and x)."""
    from ocpmx.native import linear as L
    names = {((64, 96), 1): ("fprop", "x"), ((160, 96), 1): ("fprop", "w"),
             ((64, 160), 1): ("dgrad", "dy"), ((160, 96), 0): ("dgrad", "w"),
             ((64, 160), 0): ("wgrad", "dy"), ((64, 96), 0): ("wgrad", "x")}
    seen = {}

    def spy(real):
        def f(t, element, axis=1, rounding="rne", rotation=None, conversion="ocp", **kw):
            rot = "none" if rotation is None else (
                "random_sign" if rotation.has_signs else f"hadamard{rotation.size}")
            key = names[(tuple(t.shape), axis)]
            assert key not in seen, f"{key} quantized twice"
            seen[key] = (rounding, rot) + ((conversion,) if conversion != "ocp" else ())
            return real(t, element, axis=axis, rounding=rounding, rotation=rotation,
                        conversion=conversion, **kw)
        return f
    with monkeypatch.context() as m:
        m.setattr(L, "quantize", spy(L.quantize))
        m.setattr(L, "quantize_dequantize", spy(L.quantize_dequantize))
        torch.manual_seed(1)
        lin = native.MXLinear(96, 160, recipe=recipe, seed=2, backend="emulator")
        native.set_step(lin, 5)
        x = torch.randn(64, 96, dtype=torch.bfloat16, requires_grad=True)
        lin(x).backward(torch.randn(64, 160, dtype=torch.bfloat16))
    return seen


def check_named_operands(name, recipe, monkeypatch):
    got = quantized_operands(recipe, monkeypatch)
    assert got == WGRAD_ONLY[name], f"{name}: quantized {got}, named {WGRAD_ONLY[name]}"


@pytest.mark.parametrize("name", list(WGRAD_ONLY))
def test_wgrad_arms_quantize_exactly_the_named_operands(name, monkeypatch):
    """Each Wgrad arm quantizes the operands its name gives, with the rounding and rotation it
    names, and nothing else; its Fprop and Dgrad are then nn.Linear's bf16 results bit for bit."""
    check_named_operands(name, native.RECIPES[name], monkeypatch)
    if name.startswith("mxfp4_wgrad"):
        torch.manual_seed(3)
        lin = native.MXLinear(96, 160, recipe=name, seed=2, backend="emulator")
        ref = nn.Linear(96, 160)
        ref.load_state_dict(lin.state_dict())
        x = torch.randn(64, 96, dtype=torch.bfloat16, requires_grad=True)
        xr = x.detach().clone().requires_grad_()
        gy = torch.randn(64, 160, dtype=torch.bfloat16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, yr = lin(x), ref(xr)
        y.backward(gy)
        yr.backward(gy)
        assert torch.equal(y, yr) and torch.equal(x.grad, xr.grad)
        assert not torch.equal(lin.weight.grad, ref.weight.grad)  # Wgrad: MXFP4's error


def test_a_planted_recipe_fails_the_operand_check(monkeypatch):
    """The check catches a recipe that quantizes more than its name says (Fprop too), less
    (Wgrad's X in bf16), rounds the wrong operand stochastically, or converts by OCP's rules
    where the name says gfx950's."""
    from dataclasses import replace
    from ocpmx.native.recipes import Recipe
    mx4, bf = native.GemmRecipe("mxfp4"), native.GemmRecipe("bf16")
    planted = [("mxfp4_wgrad", Recipe("mxfp4_wgrad", mx4, bf, mx4)),
               ("mxfp4_wgrad_sr", Recipe("mxfp4_wgrad_sr", bf, bf,
                                         replace(mx4, rounding=("rne", "stochastic")))),
               ("mxfp4_wgrad_h16", Recipe("mxfp4_wgrad_h16", bf, bf, mx4)),
               ("mxfp4_wgrad_sr_gfx950", Recipe("mxfp4_wgrad_sr_gfx950", bf, bf,
                                                replace(mx4, rounding=("stochastic", "rne"))))]
    for name, recipe in planted:
        with pytest.raises(AssertionError, match=name):
            check_named_operands(name, recipe, monkeypatch)


# ---- accumulation models in training (issue 23) --------------------------------------------

def _acc_layer(recipe, accumulation, seed=0):
    torch.manual_seed(seed)
    return native.MXLinear(256, 64, bias=False, recipe=recipe, accumulation=accumulation,
                           layer_id=2, seed=5)


@pytest.mark.parametrize("recipe", ["mxfp8", "mxfp4_all_h16"])
def test_accumulation_model_gives_the_emulators_gemms(recipe):
    """MXLinear(accumulation='hopper_bf16') on CPU: Fprop, Dgrad and Wgrad each equal
    emulator.mx_matmul under that model on the same quantized operands, bit for bit (float32
    activations, so no rounding after the sum); for MXFP8 they differ from the default's
    float32 sums."""
    from ocpmx.native.recipes import get_recipe
    rng = np.random.default_rng(0)
    x = torch.from_numpy((rng.standard_normal((64, 256)) * np.exp(rng.normal(0, 2, (1, 256))))
                         .astype(np.float32)).requires_grad_()
    gy = torch.from_numpy(rng.standard_normal((64, 64)).astype(np.float32))
    lay = _acc_layer(recipe, "hopper_bf16")
    y = lay(x)
    y.backward(gy)
    r = get_recipe(recipe)
    rot = lambda g: emulator.parse_rotation(g.rotation)  # noqa: E731
    w = lay.weight.detach().numpy()

    def em(g, a, a_axis, b, b_axis):
        qa = emulator.quantize(a, g.element, axis=a_axis, scale_rule=g.scale_rule,
                               rotation=rot(g))
        qb = emulator.quantize(b, g.element, axis=b_axis, scale_rule=g.scale_rule,
                               rotation=rot(g))
        t = lambda q: emulator.MXArray(q.codes.T, q.scales.T, q.fmt, 1, q.block_size,  # noqa: E731
                                       q.rotation) if q.axis == 0 else q
        return emulator.mx_matmul(t(qa), t(qb), "hopper_bf16")
    xn, gyn = x.detach().numpy(), gy.numpy()
    want = {"fprop": em(r.fprop, xn, 1, w, 1), "dgrad": em(r.dgrad, gyn, 1, w, 0),
            "wgrad": em(r.wgrad, gyn, 0, xn, 0)}
    got = {"fprop": y.detach().numpy(), "dgrad": x.grad.numpy(), "wgrad": lay.weight.grad.numpy()}
    for k in want:
        assert np.array_equal(got[k].view(np.uint32), want[k].view(np.uint32)), k
    if recipe == "mxfp8":  # E4M3 products overflow hopper_bf16's 25 bits here; E2M1's do not
        ref = _acc_layer(recipe, None)
        ref.weight.data.copy_(lay.weight.data)
        assert not torch.equal(ref(x.detach()), y.detach())


def test_accumulation_from_the_recipe_and_its_errors():
    from ocpmx.native.recipes import Recipe, RECIPES
    from dataclasses import replace
    r = replace(RECIPES["mxfp4_all"], name="mxfp4_all_hopper", accumulation="hopper_bf16")
    x = torch.randn(32, 256)
    a = native.MXLinear(256, 64, recipe=r, seed=1)
    b = native.MXLinear(256, 64, recipe="mxfp4_all", accumulation="hopper_bf16", seed=1)
    b.load_state_dict(a.state_dict())
    assert a.context.accumulation == "hopper_bf16" and torch.equal(a(x), b(x))
    assert "accumulation=hopper_bf16" in repr(a)
    with pytest.raises(ValueError, match="unknown accumulation model 'tpu'"):
        native.MXLinear(256, 64, recipe="mxfp4_all", accumulation="tpu")
    with pytest.raises(ValueError, match="unknown accumulation model"):
        Recipe("x", accumulation="fp16")
    with pytest.raises(ValueError, match="applies to MX GEMMs"):
        native.MXLinear(256, 64, recipe="fp8", accumulation="exact")
    m = native.convert_linears(torch.nn.Sequential(torch.nn.Linear(256, 64)), "mxfp8",
                               accumulation="fp32_sequential")
    assert m[0].context.accumulation == "fp32_sequential"


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name", ["bf16", "mxfp4_all", "mxfp4_wgrad"])
def test_output_dtype_under_autocast_is_nn_linears(name, bias):
    """Under a bfloat16 autocast a float32 X gives nn.Linear's dtypes: a bfloat16 Y and a
    float32 ∇X cast from a bfloat16 Dgrad GEMM, so Y and ∇X are the float32 run's rounded to
    bfloat16 (MX GEMMs: the same quantized operands either way). Where Fprop and Dgrad are
    bf16 GEMMs (the bf16 recipe, mxfp4_wgrad) Y and ∇X equal nn.Linear's bit for bit, and the
    bf16 recipe's ∇W too. Wgrad keeps its float32 GEMM output."""
    torch.manual_seed(5)
    lin = native.MXLinear(96, 160, bias=bias, recipe=name, seed=2, backend="emulator")
    ref = nn.Linear(96, 160, bias=bias)
    ref.load_state_dict(lin.state_dict())
    x = torch.randn(64, 96)
    gy = torch.randn(64, 160).to(torch.bfloat16)
    runs = []
    for module, autocast in ((lin, True), (lin, False), (ref, True)):
        xx = x.clone().requires_grad_()
        module.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = module(xx)
        y.backward(gy.to(y.dtype))
        runs.append((y.detach(), xx.grad, module.weight.grad.clone()))
    (y, gx, gw), (y32, gx32, gw32), (yr, gxr, gwr) = runs
    assert y.dtype == yr.dtype == torch.bfloat16 and y32.dtype == torch.float32
    assert gx.dtype == gx32.dtype == gxr.dtype == torch.float32
    assert gw.dtype == gw32.dtype == torch.float32
    assert torch.equal(y, y32.to(torch.bfloat16))
    assert torch.equal(gx, gx32.to(torch.bfloat16).float())
    if name == "mxfp4_all":
        assert not torch.equal(gx, gx32)  # (the MX Dgrad GEMM wrote bfloat16)
    if name in ("bf16", "mxfp4_wgrad"):
        assert torch.equal(y, yr) and torch.equal(gx, gxr)
    if name == "bf16":
        assert torch.equal(gw, gwr)
    else:
        assert torch.equal(gw, gw32)


def test_output_dtype_on_a_device_without_autocast():
    """A device autocast does not know ('meta') gives X's policy instead of an error: the bf16
    recipe's layer runs forward and backward on meta tensors, as ``nn.Linear`` does."""
    x = torch.empty(64, 96, device="meta", requires_grad=True)
    assert output_dtype(x) == torch.float32
    assert output_dtype(x.to(torch.float16)) == torch.float32
    lin = native.MXLinear(96, 160, recipe="bf16", device="meta")
    y = lin(x)
    y.sum().backward()
    assert y.dtype == torch.float32 and x.grad.shape == x.shape

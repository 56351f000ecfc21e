"""Precision recipes: how each of a Linear layer's three GEMMs is computed, as named data.

A GEMM takes two operands, quantized along its contraction dimension:
  fprop  Y  = X Wᵀ    operands (X, W),   contraction over in-features
  dgrad  ∇X = ∇Y W    operands (∇Y, W),  contraction over out-features
  wgrad  ∇W = ∇Yᵀ X   operands (∇Y, X),  contraction over tokens
A rotation acts on both operands along that dimension, so it cancels in exact arithmetic.

Precisions (``GemmRecipe.precision``): 'bf16' (torch), 'fp8' (per-tensor scaled FP8 through
``torch._scaled_mm``: E4M3 for X and W, E5M2 for ∇Y), 'mxfp8' (MX E4M3 on both operands),
'mxfp4' (MX E2M1).
Rotations: a fixed rotation by name (``ocpmx.spec.parse_rotation``: 'none', 'hadamard16',
'hadamard32', ...), or a policy that draws random signs per run: 'random_sign' (16-point
Hadamard with random signs re-drawn every step), 'random_sign_fixed' (one draw for the run).
Conversions (``GemmRecipe.conversion``, MX only): 'ocp' (the spec's, default) or 'gfx950'
(AMD MI355X's conversion instructions, ``ocpmx.emulator.gfx950``: its stochastic rounding
adds the random word's top bits below the kept mantissa; no rotation with it yet).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..spec import Rounding, ScaleRule, parse_rotation
from ..spec.rules import Conversion

GEMMS = ("fprop", "dgrad", "wgrad")
OPERANDS = {"fprop": ("x", "w"), "dgrad": ("dy", "w"), "wgrad": ("dy", "x")}
PRECISIONS = ("bf16", "fp8", "mxfp8", "mxfp4")
ROTATION_POLICIES = ("random_sign", "random_sign_fixed")
MX_ELEMENT = {"mxfp8": "e4m3", "mxfp4": "e2m1"}
FP8_ELEMENT = {"x": "e4m3", "w": "e4m3", "dy": "e5m2"}
RANDOM_SIGN_SIZE = 16

# AMD's MXFP4 kernels (ROCm TransformerEngine, Quark) round the amax mantissa before taking the
# exponent ('even'); the study ran on them, so every MX preset below uses it.
MX_SCALE_RULE = "even"


@dataclass(frozen=True)
class GemmRecipe:
    """How one GEMM is computed. ``rounding`` is per operand, in the order of OPERANDS."""

    precision: str = "bf16"
    rotation: str = "none"
    rounding: tuple[str, str] = ("rne", "rne")
    scale_rule: str = MX_SCALE_RULE
    conversion: str = "ocp"

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; expected one of {PRECISIONS}")
        if self.rotation not in ROTATION_POLICIES:
            parse_rotation(self.rotation)  # a ValueError names the options
        if len(self.rounding) != 2:
            raise ValueError(f"rounding must name one rounding per operand, got {self.rounding!r}")
        for r in self.rounding:
            Rounding.parse(r)
        ScaleRule.parse(self.scale_rule)
        conversion = Conversion.parse(self.conversion)
        object.__setattr__(self, "conversion", conversion.label)  # one spelling: 'ocp', 'gfx950'
        if self.precision not in MX_ELEMENT and (self.rotation != "none" or
                                                 self.rounding != ("rne", "rne") or
                                                 conversion != Conversion.OCP):
            raise ValueError(f"rotation, stochastic rounding and the conversion apply to MX "
                             f"formats only; {self.precision} got rotation={self.rotation}, "
                             f"rounding={self.rounding}, conversion={self.conversion}")
        if conversion != Conversion.OCP and self.rotation != "none":
            raise ValueError(f"conversion={self.conversion!r} takes no rotation yet (its kernel "
                             f"converts blocks of 32 as they are); got rotation={self.rotation}")

    @property
    def is_mx(self) -> bool:
        return self.precision in MX_ELEMENT

    @property
    def element(self) -> str | None:
        """The MX element format ('e2m1', 'e4m3'), or None for bf16 and fp8."""
        return MX_ELEMENT.get(self.precision)


@dataclass(frozen=True)
class Recipe:
    """Three GEMM entries, and ``accumulation``: None (each backend's own sums) or the name of
    an accumulation model of ``ocpmx.emulator`` ('exact', 'fp32_sequential', 'hopper_bf16',
    'hopper_fp8') under which every MX GEMM of the recipe sums its products: a chip's
    numerics emulated (CPU only for now; ``MXLinear(accumulation=...)`` overrides it)."""
    name: str
    fprop: GemmRecipe = field(default_factory=GemmRecipe)
    dgrad: GemmRecipe = field(default_factory=GemmRecipe)
    wgrad: GemmRecipe = field(default_factory=GemmRecipe)
    description: str = ""
    accumulation: str | None = None

    def __post_init__(self):
        check_accumulation(self.accumulation)

    def gemm(self, name: str) -> GemmRecipe:
        return getattr(self, name)

    @property
    def uses_mx(self) -> bool:
        return any(self.gemm(g).is_mx for g in GEMMS)


def check_accumulation(model: str | None) -> None:
    """A ValueError naming the choices unless ``model`` is None or an emulator model name."""
    from ..emulator.accumulate import MODELS
    if model is not None and model not in MODELS:
        raise ValueError(f"unknown accumulation model {model!r}; expected None or one of "
                         f"{', '.join(MODELS)}")


_BF16 = GemmRecipe("bf16")
_FP8 = GemmRecipe("fp8")
_MX4 = GemmRecipe("mxfp4")
_MX8 = GemmRecipe("mxfp8")
_H16 = replace(_MX4, rotation="hadamard16")

RECIPES: dict[str, Recipe] = {r.name: r for r in [
    Recipe("bf16", _BF16, _BF16, _BF16, "all three GEMMs in bf16 (the reference)"),
    Recipe("fp8", _FP8, _FP8, _FP8, "per-tensor FP8: E4M3 activations and weights, E5M2 gradients"),
    Recipe("mxfp8", _MX8, _MX8, _MX8, "MXFP8 (E4M3) in all three GEMMs"),
    Recipe("mxfp4_fprop", _MX4, _BF16, _BF16, "MXFP4 in Fprop only"),
    Recipe("mxfp4_fprop_dgrad", _MX4, _MX4, _BF16, "MXFP4 in Fprop and Dgrad"),
    Recipe("mxfp4_all", _MX4, _MX4, _MX4, "MXFP4 in all three GEMMs, no rotation"),
    Recipe("mxfp4_all_h16", _H16, _H16, _H16,
           "AMD's MLPerf recipe: fixed 16-point Hadamard on each half of every block along the "
           "contraction dimension, on every MXFP4 operand (weights included)"),
    Recipe("mxfp4_all_h16_wgrad", _MX4, _MX4, _H16, "MXFP4 everywhere, fixed H16 on Wgrad only"),
    Recipe("mxfp4_all_sr_wgrad", _MX4, _MX4, replace(_MX4, rounding=("stochastic", "stochastic")),
           "MXFP4 everywhere, stochastic rounding of both Wgrad operands (dY and X; the usual "
           "placement, dY only, is mxfp4_wgrad_sr's)"),
    Recipe("mxfp4_all_rht_wgrad", _MX4, _MX4, replace(_MX4, rotation="random_sign"),
           "MXFP4 everywhere, random-sign H16 on Wgrad re-drawn every step"),
    Recipe("mxfp4_all_rht_fixed_wgrad", _MX4, _MX4, replace(_MX4, rotation="random_sign_fixed"),
           "MXFP4 everywhere, random-sign H16 on Wgrad drawn once"),
    # Wgrad-only arms (issue 16): Fprop and Dgrad in bf16, so the forward and the gradients
    # flowing back are exact, and only the weight gradient carries MXFP4's error
    Recipe("mxfp4_wgrad", _BF16, _BF16, _MX4, "MXFP4 in Wgrad only (dY and X), no rotation"),
    Recipe("mxfp4_wgrad_h16", _BF16, _BF16, _H16,
           "MXFP4 in Wgrad only, fixed 16-point Hadamard on both Wgrad operands"),
    Recipe("mxfp4_wgrad_rht", _BF16, _BF16, replace(_MX4, rotation="random_sign"),
           "MXFP4 in Wgrad only, random-sign H16 on both Wgrad operands, re-drawn every step"),
    Recipe("mxfp4_wgrad_sr", _BF16, _BF16, replace(_MX4, rounding=("stochastic", "rne")),
           "MXFP4 in Wgrad only, stochastic rounding of dY (X round-to-nearest-even)"),
    Recipe("mxfp4_wgrad_sr_gfx950", _BF16, _BF16,
           replace(_MX4, rounding=("stochastic", "rne"), conversion="gfx950"),
           "mxfp4_wgrad_sr with AMD MI355X's conversions (its stochastic rounding of dY: the "
           "random word's top bits added below the kept mantissa, then truncated)"),
]}


def get_recipe(recipe) -> Recipe:
    if isinstance(recipe, Recipe):
        return recipe
    try:
        return RECIPES[recipe]
    except KeyError:
        raise ValueError(f"unknown recipe {recipe!r}; known: {', '.join(RECIPES)}") from None

"""A torchao-style entry point: ``quantize_(model, MXRecipeConfig(...), filter_fn=...)``.

``MXRecipeConfig`` is a torchao ``AOBaseConfig`` (when torchao is installed) whose handler,
registered with torchao's ``register_quantize_module_handler``, replaces an ``nn.Linear`` by
``MXLinear.from_linear`` (the same Parameters). So torchao's own driver works::

    from torchao.quantization import quantize_
    quantize_(model, MXRecipeConfig("mxfp4_all_h16"),
              filter_fn=lambda m, fqn: isinstance(m, nn.Linear) and fqn != "output")

and ``ocpmx.native.quantize_`` (this module's ``quantize_``, no torchao needed) takes the same
arguments. ``convert_linears(model, recipe, rules=...)`` stays.

torchao's filter sees every module, the model itself first (fqn ""), and hands the first module
it accepts to the handler without looking inside it; a filter that accepts a container (e.g.
``lambda m, fqn: fqn != "output"`` accepts the model) would give the handler the whole model,
and the handler raises a TypeError saying to add ``isinstance(m, nn.Linear)`` (torchao's own
configs fail on such a filter too). ``ocpmx.native.quantize_`` asks the filter about Linear
layers only, so that filter works there as written.

Layer ids (which key stochastic rounding and re-drawn random signs, ``GemmContext``):
  * ``ocpmx.native.quantize_`` and a config bound to the model (``config.bind(model)``) give
    every layer the id ``convert_linears`` gives it: its position among all the model's
    ``nn.Linear``/``MXLinear`` modules in ``named_modules()`` order, counting the layers the
    filter leaves alone. Same model and recipe -> the same bits as ``convert_linears``.
  * An unbound config (torchao's handler sees one module at a time, never its name) numbers the
    layers it converts 0, 1, 2, ... in the order torchao visits them, which is the model order.
    That equals ``convert_linears`` when the filter leaves out only layers after the last
    converted one (the usual ``output`` head); otherwise the ids after a skipped layer are
    lower by the number skipped. The counter lives in the config object: use a fresh config
    (or ``bind``) per model.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, replace
from typing import Callable

from torch import nn

from .linear import MXLinear
from .recipes import Recipe, get_recipe

try:
    from torchao.core.config import AOBaseConfig
    from torchao.quantization.transform_module import register_quantize_module_handler
    HAVE_TORCHAO = True
except ImportError:  # the config still drives ocpmx.native.quantize_
    AOBaseConfig = object
    HAVE_TORCHAO = False


def linear_layer_ids(model: nn.Module) -> dict[nn.Module, int]:
    """The layer id ``convert_linears`` gives each ``nn.Linear``/``MXLinear`` of ``model``: its
    position among them in ``named_modules()`` order."""
    ids: dict[nn.Module, int] = {}
    for _, mod in model.named_modules():
        if _convertible(mod):
            ids[mod] = len(ids)
    return ids


def _convertible(mod: nn.Module) -> bool:
    """What ``convert_linears`` converts: exactly nn.Linear, or an MXLinear (other subclasses
    of nn.Linear are left alone)."""
    return type(mod) is nn.Linear or isinstance(mod, MXLinear)


@dataclass
class MXRecipeConfig(AOBaseConfig):
    """Replace each selected ``nn.Linear`` by an ``MXLinear`` with ``recipe`` (a name in
    ``ocpmx.native.RECIPES`` or a Recipe); ``seed``, ``backend`` and ``method`` as MXLinear's.
    Layer ids: see the module doc (``bind(model)`` for ``convert_linears``' ids under
    torchao's ``quantize_``)."""

    recipe: str | Recipe = "mxfp4_all_h16"
    seed: int = 0
    backend: str | None = None
    method: str = "auto"

    def __post_init__(self):
        get_recipe(self.recipe)  # an unknown name fails here, not at the first layer
        self._next_layer = 0
        self._layer_ids: weakref.WeakKeyDictionary | None = None

    def bind(self, model: nn.Module) -> MXRecipeConfig:
        """A copy of this config that gives each layer of ``model`` the id ``convert_linears``
        gives it (whatever the filter skips)."""
        bound = replace(self)
        bound._layer_ids = weakref.WeakKeyDictionary(linear_layer_ids(model))
        return bound

    def layer_id(self, module: nn.Module) -> int:
        """The id of ``module``, converted next (advances an unbound config's counter)."""
        if self._layer_ids is not None:
            try:
                return self._layer_ids[module]
            except KeyError:
                raise ValueError(f"{type(module).__name__} is not a Linear layer of the model "
                                 "this config was bound to") from None
        lid = self._next_layer
        self._next_layer += 1
        return lid

    def convert(self, module: nn.Module, layer_id: int) -> MXLinear:
        return MXLinear.from_linear(module, self.recipe, layer_id=layer_id, seed=self.seed,
                                    backend=self.backend, method=self.method)


def _transform(module: nn.Module, config: MXRecipeConfig) -> nn.Module:
    """torchao's handler for MXRecipeConfig: one module in, its replacement out."""
    if _convertible(module):
        return config.convert(module, config.layer_id(module))
    if isinstance(module, nn.Linear):  # a subclass: left alone, as convert_linears does
        return module
    raise TypeError(
        f"MXRecipeConfig replaces nn.Linear layers, and quantize_ handed it a "
        f"{type(module).__name__}: the filter_fn accepted a module that is not a Linear (torchao "
        f"then converts that module whole and does not look inside it; the model itself comes "
        f"first, with fqn ''). Add the Linear check, e.g. filter_fn=lambda m, fqn: "
        f"isinstance(m, nn.Linear) and fqn != 'output', or call ocpmx.native.quantize_")


if HAVE_TORCHAO:
    register_quantize_module_handler(MXRecipeConfig)(_transform)


def quantize_(model: nn.Module, config: MXRecipeConfig,
              filter_fn: Callable[[nn.Module, str], bool] | None = None) -> nn.Module:
    """torchao's ``quantize_`` signature, in place, without torchao: every ``nn.Linear`` (and
    MXLinear) whose ``filter_fn(module, fqn)`` is true (all when None) becomes an MXLinear
    with ``config``, its layer id the one ``convert_linears`` gives it. Returns ``model``."""
    if not isinstance(config, MXRecipeConfig):
        raise TypeError(f"ocpmx.native.quantize_ takes an MXRecipeConfig, got "
                        f"{type(config).__name__} (torchao's own configs go to "
                        f"torchao.quantization.quantize_)")
    ids = linear_layer_ids(model)
    targets = [(name, mod) for name, mod in model.named_modules()
               if mod in ids and (filter_fn is None or filter_fn(mod, name))]
    for name, mod in targets:
        if not name:
            raise ValueError("the model is itself a Linear layer: quantize_ replaces layers "
                             "inside a model; use MXLinear.from_linear(model, recipe)")
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, config.convert(mod, ids[mod]))
    return model

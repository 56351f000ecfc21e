"""Training configuration in typed sections, in the manner of torchtitan's job config: plain
data (no torch or Triton import, so that building the command line does not import Triton before
``ocpmx conform --device cpu`` switches on its interpreter).

Every field name is unique across the sections, so a configuration is also a flat mapping
(``TrainConfig.from_flat`` / ``to_flat``): the ``ocpmx train`` flags (``--max-steps`` for
``max_steps``), ``TRAIN_PRESETS`` and a run's config.json use the flat names.
"""
from __future__ import annotations

import math
import tomllib
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from typing import Literal, Optional


class TrainingDiverged(RuntimeError):
    pass


class RunExists(FileExistsError, ValueError):
    """OUT holds a run and neither resume nor overwrite was asked for. A FileExistsError, and a
    ValueError so that ``ocpmx``'s commands report it as a bad argument (one line, exit 2)."""


def _field(default, help: str, **metadata):
    """A section field with its description (the ``ocpmx train --help`` text)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **metadata})
    return field(default=default, metadata={"help": help, **metadata})


@dataclass
class ModelSection:
    """The model."""
    preset: str = _field("tiny", "model size: 8b, 125m, 30m, tiny")
    layers: Optional[int] = _field(
        None, "transformer blocks; None: the preset's. Fewer make a proxy with the preset's "
              "layer shapes, e.g. timing 8b's layers on one GPU")


@dataclass
class DataSection:
    """Training and validation data."""
    data: str = _field("data/c4-mini", "corpus directory (C4 layout)")
    tokenizer: Optional[str] = _field(None, "tokenizer file; None: DATA/tokenizer.json")
    seq_len: int = _field(128, "tokens per sequence")
    batch_size: int = _field(8, "sequences per micro-batch and rank")
    grad_accum: int = _field(1, "micro-batches per optimizer step")
    data_order: Literal["shards", "sequences"] = _field(
        "shards", "training order: shards (v1: shard order shuffled per epoch, documents in file "
                  "order, consecutive sequences) or sequences (a seeded permutation of all "
                  "seq_len-token windows of the split, drawn afresh every epoch)")


@dataclass
class OptimizerSection:
    """AdamW, gradient clipping, the learning-rate schedule and the initial weights."""
    lr: float = _field(1e-3, "peak learning rate")
    min_lr_ratio: float = _field(0.1, "final learning rate as a fraction of lr")
    warmup_steps: int = _field(10, "steps of linear warm-up")
    decay_steps: Optional[int] = _field(None, "length of the cosine decay; None: max_steps")
    schedule: Literal["cosine", "wsd"] = _field(
        "cosine", "after the warm-up: cosine to min_lr_ratio over decay_steps, or wsd (warm-up, "
                  "stable: constant lr, then a linear decay to min_lr_ratio over the last "
                  "decay_fraction of decay_steps)")
    decay_fraction: float = _field(0.2, "wsd: the fraction of the steps that decays")
    weight_decay: float = _field(0.1, "AdamW weight decay of the matrices")
    betas: tuple[float, float] = _field((0.9, 0.95), "AdamW betas")
    eps: float = _field(1e-5, "AdamW epsilon")
    clip: float = _field(1.0, "gradient-norm clipping threshold")
    init_std: float = _field(0.02, "standard deviation of the initial weights")


@dataclass
class TrainingSection:
    """The run."""
    max_steps: int = _field(100, "optimizer steps")
    seed: int = _field(0, "seed of the initial weights, the data order and the recipes' "
                          "random bits")
    nan_policy: Literal["stop", "skip"] = _field(
        "stop", "on a non-finite loss or gradient norm: stop (the last good checkpoint stays) "
                "or skip the update")
    compile: bool = _field(False, "torch.compile the model")
    compile_mode: Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"] = _field(
        "default", "torch.compile's mode with --compile: default, or reduce-overhead (each "
                   "micro-batch's forward and backward replay as CUDA graphs: no host time per "
                   "kernel), or max-autotune-no-cudagraphs")
    activation_checkpointing: bool = _field(False, "recompute each block's activations in the "
                                                   "backward pass")
    deterministic: bool = _field(
        False, "ask for the same bits on every run of a seed (two 40-step GPU runs were "
               "bit-identical on an H200; a CPU's thread count is not covered: it warns): "
               "torch.use_deterministic_algorithms (an op with no deterministic kernel is an "
               "error), cuBLAS's fixed workspace, and Inductor's deterministic mode (no on-device "
               "benchmarking that picks kernels by their speed, which a shared GPU perturbs)")
    device: Literal["auto", "cpu", "cuda"] = _field("auto", "auto: cuda when available")


@dataclass
class EvalSection:
    """Validation."""
    eval_every: int = _field(50, "validation loss every N steps and after the last")
    eval_sequences: int = _field(16, "validation sequences")
    target_loss: Optional[float] = _field(None, "stop once the validation loss reaches it")
    eval_sampling: Literal["first", "spread"] = _field(
        "first", "validation sequences: the first ones of the validation split (v1), or spread "
                 "evenly over the whole split")


@dataclass
class CheckpointSection:
    """Checkpoints in OUT/checkpoints."""
    save_every: int = _field(50, "checkpoint every N steps and after the last; 0: never")
    keep: int = _field(2, "checkpoints kept")
    keep_steps: list[int] = _field([], "also save after these steps and keep those checkpoints "
                                       "(besides the last --keep): for later analyses")
    checkpoint_format: Literal["full", "sharded"] = _field(
        "full", "full: one safetensors file set, gathered on rank 0; sharded: "
                "torch.distributed.checkpoint, every rank writing its shards")


@dataclass
class PrecisionSection:
    """The precision recipe of the Linear layers."""
    recipe: str = _field("bf16", "precision recipe (ocpmx.native.RECIPES)")
    backend: Optional[Literal["triton", "emulator"]] = _field(
        None, "MXLinear quantization; None: Triton on a GPU, the emulator on CPU",
        aliases=("--mx-backend",))
    keep_bf16: list[str] = _field(["output"], "Linear layers left in bf16 (fnmatch patterns "
                                              "of module names)")
    gemm_method: Literal["auto", "dot_scaled", "bf16", "fp8_exact", "fp8", "fp8_cublas",
                         "fp8_cublas_rowwise"] = _field(
        "auto", "how the Triton backend runs each MX GEMM (ocpmx.native.mx_matmul's method; "
                "auto: dot_scaled on MX units, bf16 elsewhere); the method that ran is recorded "
                "in config.json, and the fold methods' rounded elements in metrics.jsonl")
    accumulation: Optional[Literal["exact", "fp32_sequential", "hopper_bf16", "hopper_fp8",
                                   "hopper_fp8_exact", "hopper_fp8_chained",
                                   "hopper_fp8_cublas", "hopper_fp8_cublas_rowwise"]] = \
        _field(None, "sum every MX GEMM under this emulator accumulation model, bit for bit "
                     "(a chip's numerics; CPU: the emulator, GPU: mx_matmul method 'emulate', "
                     "every model but 'exact'; slow); None: the backend's own sums")


@dataclass
class LoggingSection:
    """The run directory and what goes into it besides checkpoints."""
    out: str = _field("out/run", "run directory: config.json, metrics.jsonl, checkpoints")
    tensorboard: bool = _field(True, "TensorBoard scalars in OUT/tb (when tensorboard is "
                                     "installed)")
    progress: bool = _field(True, "progress bar")
    log_every: int = _field(10, "a progress line (step, loss, lr, tokens/s, ETA) through Python "
                                "logging every N steps and after the last, with or without the "
                                "bar; 0: none")
    profile_step: Optional[int] = _field(None, "profile steps N and N+1: GPU time by kernel "
                                               "category in OUT/step_breakdown.json")


# names of config.json files written before the sections
_RENAMED = {"mx_backend": "backend"}
# what config.json records beside the flat configuration: facts of the run, not options
RUN_FACTS = ("model", "world", "gemm_method_run", "linear_both_axes_run", "tuning_run")


@dataclass
class TrainConfig:
    """A training run's configuration, one section per concern."""
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    training: TrainingSection = field(default_factory=TrainingSection)
    eval: EvalSection = field(default_factory=EvalSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    precision: PrecisionSection = field(default_factory=PrecisionSection)
    logging: LoggingSection = field(default_factory=LoggingSection)

    @classmethod
    def from_flat(cls, **values) -> TrainConfig:
        """The configuration from flat field names (``max_steps=10``); the others keep their
        defaults. Accepts the names of older config.json files (``mx_backend``)."""
        section_of = {f.name: s for s, f, _ in section_fields()}
        per_section: dict[str, dict] = {s: {} for s in section_types()}
        for name, v in values.items():
            name = _RENAMED.get(name, name)
            if name not in section_of:
                raise TypeError(f"TrainConfig has no field {name!r}")
            per_section[section_of[name]][name] = v
        return cls(**{s: t(**per_section[s]) for s, t in section_types().items()})

    def to_flat(self) -> dict:
        """{field name: value} over all sections."""
        return {k: v for s in fields(self) for k, v in asdict(getattr(self, s.name)).items()}

    def validate(self):
        """Check the configuration against the model preset and the recipe; returns the
        model's configuration."""
        from ..native.recipes import get_recipe
        from .model import get_config
        layers = self.model.layers
        if layers is not None and layers < 1:
            raise ValueError(f"layers must be >= 1 (or None: the preset's), got {layers}")
        cfg = get_config(self.model.preset, **({} if layers is None else {"n_layers": layers}))
        recipe = get_recipe(self.precision.recipe)  # unknown recipe -> ValueError
        data = self.data
        if recipe.uses_mx:
            for name, dim in (("dim", cfg.dim), ("ffn_dim", cfg.ffn_dim),
                              ("kv dim", cfg.n_kv_heads * cfg.head_dim)):
                if dim % 32:
                    raise ValueError(f"recipe {self.precision.recipe} needs sizes divisible by "
                                     f"32; preset {self.model.preset} has {name} = {dim}")
            if (data.batch_size * data.seq_len) % 32:
                raise ValueError(f"recipe {self.precision.recipe}: Wgrad contracts over tokens; "
                                 f"batch_size * seq_len = {data.batch_size * data.seq_len} is "
                                 "not divisible by 32")
        for section, f, hint in section_fields():
            allowed = choices(hint)
            value = getattr(getattr(self, section), f.name)
            if allowed and value not in allowed:
                raise ValueError(f"{f.name} must be {_either(allowed)}, got {value!r}")
        if self.training.compile_mode != "default" and not self.training.compile:
            raise ValueError(f"--compile-mode {self.training.compile_mode} needs --compile")
        if self.precision.accumulation is not None and self.training.compile:
            raise ValueError("accumulation models run eagerly: drop --compile")
        if self.precision.accumulation is not None and self.precision.gemm_method != "auto":
            raise ValueError(f"--accumulation {self.precision.accumulation} decides how every MX "
                             f"GEMM is summed; drop --gemm-method {self.precision.gemm_method}")
        if data.seq_len > cfg.max_seq_len:
            raise ValueError(f"seq_len {data.seq_len} exceeds the preset's {cfg.max_seq_len}")
        if not 0 <= self.optimizer.decay_fraction <= 1:
            raise ValueError("decay_fraction must lie in [0, 1]")
        for n, v in (("max_steps", self.training.max_steps), ("batch_size", data.batch_size),
                     ("grad_accum", data.grad_accum), ("seq_len", data.seq_len)):
            if v < 1:
                raise ValueError(f"{n} must be >= 1")
        return cfg


def load_toml(path) -> dict:
    """The flat values of a TOML run file sectioned as TrainConfig is (``[training]
    max_steps = 100``, ``[optimizer] betas = [0.9, 0.95]``). Raises ValueError naming unknown
    sections or keys and values of the wrong type."""
    with open(path, "rb") as fh:
        try:
            doc = tomllib.load(fh)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: {e}") from None
    types_ = section_types()
    hints = {(s, f.name): h for s, f, h in section_fields()}
    unknown = [s for s in doc if s not in types_ or not isinstance(doc[s], dict)]
    unknown += [f"{s}.{k}" for s in doc if s in types_ and isinstance(doc[s], dict)
                for k in doc[s] if (s, k) not in hints]
    if unknown:
        raise ValueError(f"{path}: unknown {'key' if len(unknown) == 1 else 'keys'} "
                         f"{', '.join(unknown)} (sections: {', '.join(types_)})")
    flat = {}
    for section, values in doc.items():
        for k, v in values.items():
            flat[k] = check_type(f"{section}.{k}", hints[section, k], v, str(path))
    return flat


def check_type(name: str, hint, value, where: str = ""):
    """``value`` as the field's type (a list for a tuple, an int for a float); ValueError
    naming the field when it does not fit."""
    inner = optional_inner(hint)
    base = hint if inner is None else inner
    origin, args = typing.get_origin(base), typing.get_args(base)
    ok = True
    if origin is Literal:
        ok = value in args  # validate() words the message for a Literal
        if not ok:
            raise ValueError(f"{where + ': ' if where else ''}{name} must be "
                             f"{_either(choices(hint))}, got {value!r}")
    elif origin in (tuple, list):
        ok = isinstance(value, list) and (origin is list or len(value) == len(args))
        if ok:
            value = [check_type(name, args[0 if origin is list else i], v, where)
                     for i, v in enumerate(value)]
            value = tuple(value) if origin is tuple else value
    elif base is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif base is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, base)
    if not ok:
        shown = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
        raise ValueError(f"{where + ': ' if where else ''}{name} must be {shown}, "
                         f"got {value!r}")
    return value


def section_types() -> dict[str, type]:
    """{section attribute: section class} in TrainConfig's order."""
    return typing.get_type_hints(TrainConfig)


def section_fields():
    """(section attribute, dataclass field, resolved type) of every field, in order."""
    for section, cls in section_types().items():
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            yield section, f, hints[f.name]


def optional_inner(hint):
    """X for Optional[X] (X | None); otherwise None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(inner) == 1:
            return inner[0]
    return None


def choices(hint) -> tuple:
    """The values a Literal type allows (with None for an Optional Literal); () otherwise."""
    inner = optional_inner(hint)
    base = hint if inner is None else inner
    if typing.get_origin(base) is not Literal:
        return ()
    return typing.get_args(base) + (() if inner is None else (None,))


def _either(values) -> str:
    names = [repr(v) for v in values]
    return " or ".join(names) if len(names) < 3 else f"{', '.join(names[:-1])} or {names[-1]}"


# MLPerf Llama 3.1 8B (mlcommons/training small_llm_pretraining, AMD's submission settings)
TRAIN_PRESETS = {
    "mlperf": dict(preset="8b", seq_len=8192, batch_size=1, grad_accum=32, lr=8e-4,
                   min_lr_ratio=0.1, warmup_steps=64, decay_steps=1_200_000, weight_decay=0.1,
                   eval_every=384, eval_sequences=1024, target_loss=3.3),
}


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over warmup_steps, then (schedule 'cosine') cosine from lr to
    lr * min_lr_ratio at decay_steps (default max_steps), or (schedule 'wsd') lr held constant
    until the last decay_fraction of decay_steps, then a linear decay to lr * min_lr_ratio."""
    o = cfg.optimizer
    if step < o.warmup_steps:
        return o.lr * (step + 1) / o.warmup_steps
    total = o.decay_steps or cfg.training.max_steps
    lo = o.lr * o.min_lr_ratio
    if o.schedule == "wsd":
        start = wsd_decay_start(cfg)
        t = min(1.0, max(0, step - start + 1) / max(1, total - start))
        return o.lr + (lo - o.lr) * t
    t = min(1.0, (step - o.warmup_steps) / max(1, total - o.warmup_steps))
    return lo + 0.5 * (o.lr - lo) * (1 + math.cos(math.pi * t))


def wsd_decay_start(cfg: TrainConfig) -> int:
    """The first step of a wsd schedule's decay: the last decay_fraction of decay_steps (at the
    earliest after the warm-up); the learning rate is constant before it."""
    o = cfg.optimizer
    total = o.decay_steps or cfg.training.max_steps
    return max(o.warmup_steps, total - round(o.decay_fraction * total))

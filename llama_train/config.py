"""Training configuration: plain data (no torch or Triton import, so that building the command
line does not import Triton before ``ocpmx conform --device cpu`` switches on its interpreter)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field


class TrainingDiverged(RuntimeError):
    pass


@dataclass
class TrainConfig:
    preset: str = "tiny"
    recipe: str = "bf16"
    out: str = "out/run"
    data: str = "data/c4-mini"
    tokenizer: str | None = None      # default: <data>/tokenizer.json
    max_steps: int = 100
    batch_size: int = 8                # sequences per micro-batch
    grad_accum: int = 1
    seq_len: int = 128
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    decay_steps: int | None = None     # cosine length; default max_steps
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-5
    clip: float = 1.0
    init_std: float = 0.02
    eval_every: int = 50
    eval_sequences: int = 16
    target_loss: float | None = None
    save_every: int = 50               # 0: no checkpoints (throughput runs)
    keep: int = 2
    checkpoint_format: str = "full"    # 'full': one safetensors file set; 'sharded': DCP per rank
    profile_step: int | None = None    # profile steps N and N+1 (GPU time by kernel category)
    seed: int = 0
    nan_policy: str = "stop"           # or 'skip'
    compile: bool = False
    activation_checkpointing: bool = False
    device: str = "auto"
    mx_backend: str | None = None      # MXLinear quantization: None (GPU: Triton, CPU: emulator)
    keep_bf16: list[str] = field(default_factory=lambda: ["output"])
    tensorboard: bool = True           # OUT/tb when the tensorboard package is installed
    progress: bool = True

    def validate(self):
        from ..native.recipes import get_recipe
        from .model import get_config
        cfg = get_config(self.preset)
        recipe = get_recipe(self.recipe)  # unknown recipe -> ValueError
        if recipe.uses_mx:
            for name, dim in (("dim", cfg.dim), ("ffn_dim", cfg.ffn_dim),
                              ("kv dim", cfg.n_kv_heads * cfg.head_dim)):
                if dim % 32:
                    raise ValueError(f"recipe {self.recipe} needs sizes divisible by 32; preset "
                                     f"{self.preset} has {name} = {dim}")
            if (self.batch_size * self.seq_len) % 32:
                raise ValueError(f"recipe {self.recipe}: Wgrad contracts over tokens; "
                                 f"batch_size * seq_len = {self.batch_size * self.seq_len} is not "
                                 "divisible by 32")
        if self.checkpoint_format not in ("full", "sharded"):
            raise ValueError(f"checkpoint_format must be 'full' or 'sharded', got "
                             f"{self.checkpoint_format!r}")
        if self.nan_policy not in ("stop", "skip"):
            raise ValueError(f"nan_policy must be 'stop' or 'skip', got {self.nan_policy!r}")
        if self.seq_len > cfg.max_seq_len:
            raise ValueError(f"seq_len {self.seq_len} exceeds the preset's {cfg.max_seq_len}")
        for n in ("max_steps", "batch_size", "grad_accum", "seq_len"):
            if getattr(self, n) < 1:
                raise ValueError(f"{n} must be >= 1")
        return cfg


# MLPerf Llama 3.1 8B (mlcommons/training small_llm_pretraining, AMD's submission settings)
TRAIN_PRESETS = {
    "mlperf": dict(preset="8b", seq_len=8192, batch_size=1, grad_accum=32, lr=8e-4,
                   min_lr_ratio=0.1, warmup_steps=64, decay_steps=1_200_000, weight_decay=0.1,
                   eval_every=384, eval_sequences=1024, target_loss=3.3),
}


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over warmup_steps, then cosine from lr to lr * min_lr_ratio."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    total = cfg.decay_steps or cfg.max_steps
    t = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    lo = cfg.lr * cfg.min_lr_ratio
    return lo + 0.5 * (cfg.lr - lo) * (1 + math.cos(math.pi * t))



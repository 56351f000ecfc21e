"""Llama 3.1 (RMSNorm, RoPE with Llama 3 frequency scaling, grouped-query attention, SwiGLU),
sizes in one table. Attention itself runs through ``scaled_dot_product_attention`` (flash on
GPUs); every Linear can be swapped for an MXLinear by ``ocpmx.native.convert_linears``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    # Llama 3.1 RoPE scaling (factor 8, low/high frequency factors 1 and 4, 8192 original)
    rope_scaling: tuple[float, float, float, int] | None = (8.0, 1.0, 4.0, 8192)
    norm_eps: float = 1e-5
    max_seq_len: int = 8192

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def n_params(self, embedding: bool = True) -> int:
        d, f, kv = self.dim, self.ffn_dim, self.n_kv_heads * self.head_dim
        per_layer = d * d * 2 + d * kv * 2 + 3 * d * f + 2 * d
        emb = 2 * self.vocab_size * d if embedding else 0  # untied input and output
        return self.n_layers * per_layer + d + emb


# One table of sizes. '8b' is exactly Llama 3.1-8B.
PRESETS: dict[str, ModelConfig] = {
    "8b": ModelConfig(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336),
    "125m": ModelConfig(dim=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_dim=2048,
                        vocab_size=32768, max_seq_len=2048),
    "30m": ModelConfig(dim=512, n_layers=8, n_heads=8, n_kv_heads=2, ffn_dim=1792,
                       vocab_size=32768, max_seq_len=1024),
    "tiny": ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=192,
                        vocab_size=512, max_seq_len=256),
}


def get_config(preset: str, **overrides) -> ModelConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    return replace(PRESETS[preset], **overrides)


def rope_frequencies(cfg: ModelConfig, seq_len: int, device=None) -> torch.Tensor:
    """Complex rotations (seq_len, head_dim / 2) with Llama 3's frequency scaling."""
    hd = cfg.head_dim
    freqs = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    if cfg.rope_scaling is not None:
        factor, low, high, old_ctx = cfg.rope_scaling
        wavelen = 2 * math.pi / freqs
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        smooth = (old_ctx / wavelen - low) / (high - low)
        scaled = torch.where(wavelen > low_wavelen, freqs / factor, freqs)
        mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        freqs = torch.where(mid, (1 - smooth) * freqs / factor + smooth * freqs, scaled)
    t = torch.arange(seq_len, dtype=torch.float64)
    angles = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(angles), angles).to(torch.complex64).to(device)


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """x (batch, seq, heads, head_dim) rotated pairwise by freqs (seq, head_dim / 2)."""
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * freqs[None, :, None, :]).flatten(-2)
    return out.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * \
            self.weight.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)

    def forward(self, x, freqs):
        b, t, _ = x.shape
        hd = self.cfg.head_dim
        q = apply_rope(self.wq(x).view(b, t, self.cfg.n_heads, hd), freqs)
        k = apply_rope(self.wk(x).view(b, t, self.cfg.n_kv_heads, hd), freqs)
        v = self.wv(x).view(b, t, self.cfg.n_kv_heads, hd)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.cfg.n_kv_heads != self.cfg.n_heads)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x, freqs):
        x = x + self.attention(self.attention_norm(x), freqs)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.activation_checkpointing = False

    def init_weights(self, std: float = 0.02, generator: torch.Generator | None = None):
        """Normal(0, std) for every Linear and the embedding (the MLPerf reference's init),
        ones for the norms; deterministic under ``generator``. Each full parameter is drawn on
        the generator's device in parameter order and, for a parameter sharded by FSDP2 (a
        DTensor), only this rank's shard is kept: the initial weights are the same for every
        world size."""
        gen_device = generator.device if generator is not None else torch.device("cpu")
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() == 1:
                    full = torch.ones(p.shape, dtype=p.dtype, device=gen_device)
                else:
                    full = torch.empty(p.shape, dtype=p.dtype, device=gen_device)
                    full.normal_(0.0, std, generator=generator)
                if hasattr(p, "device_mesh"):  # a DTensor shard
                    from torch.distributed.tensor import distribute_tensor
                    full = distribute_tensor(full.to(p.device), p.device_mesh, p.placements,
                                             src_data_rank=None)
                p.copy_(full)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        freqs = rope_frequencies(self.cfg, t, tokens.device)
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            if self.activation_checkpointing and self.training:
                h = torch.utils.checkpoint.checkpoint(layer, h, freqs, use_reentrant=False)
            else:
                h = layer(h, freqs)
        return self.output(self.norm(h))


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 N (non-embedding matmuls and the output head) plus
    attention's 12 * layers * dim * seq (forward + backward, causal mask not discounted)."""
    n = cfg.n_params(embedding=False) + cfg.vocab_size * cfg.dim
    return 6.0 * n + 12.0 * cfg.n_layers * cfg.dim * seq_len

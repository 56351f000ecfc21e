"""The `ocpmx` command line: subcommands for the emulator (and later the kernels,
conformance and training)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def _parse_rotation(text: str | None):
    from .spec import parse_rotation
    try:
        return parse_rotation(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def load_tensor(path: Path, key: str | None) -> tuple[np.ndarray, str]:
    """Read a tensor from .npy or .safetensors (bf16 kept as ml_dtypes.bfloat16)."""
    if path.suffix == ".npy":
        return np.load(path, allow_pickle=False), path.stem
    if path.suffix == ".safetensors":
        import ml_dtypes
        from safetensors import safe_open
        with safe_open(str(path), framework="numpy") as f:
            keys = list(f.keys())
            if key is None:
                if len(keys) != 1:
                    raise SystemExit(f"{path} holds {len(keys)} tensors {keys}; choose one with --key")
                key = keys[0]
            if key not in keys:
                raise SystemExit(f"{path} has no tensor {key!r}; it has {keys}")
            dtype = f.get_slice(key).get_dtype()
            if dtype == "BF16":  # numpy has no bf16: read the raw bytes
                raw = _read_raw_safetensor(path, key)
                return raw.view(ml_dtypes.bfloat16), key
            return f.get_tensor(key), key
    raise SystemExit(f"unsupported input {path}: expected .npy or .safetensors")


def _read_raw_safetensor(path: Path, key: str) -> np.ndarray:
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    info = header[key]
    start, end = info["data_offsets"]
    buf = np.frombuffer(data[8 + n + start:8 + n + end], np.uint16)
    return buf.reshape(info["shape"])


def cmd_quantize(args) -> int:
    from safetensors.numpy import save_file
    from .emulator import quantize
    from .emulator.stats import error_stats

    x, name = load_tensor(Path(args.input), args.key)
    mx = quantize(x, args.format, axis=args.axis, block_size=args.block_size,
                  scale_rule=args.scale_rule, rounding=args.rounding, seed=args.seed,
                  rotation=args.rotation)
    stats = error_stats(x, mx)
    out = Path(args.out) if args.out else Path(args.input).with_suffix(f".{mx.fmt.name}.safetensors")
    meta = {"format": mx.fmt.name, "axis": str(mx.axis), "block_size": str(mx.block_size),
            "scale_rule": args.scale_rule, "rounding": args.rounding, "seed": str(args.seed),
            "rotation": mx.rotation.name if mx.rotation else "none",
            "shape": json.dumps(list(mx.shape)),
            "packing": "along axis; FP4 element 0 in the low nibble; FP6 4 codes per 3 bytes LE"}
    tmp = out.with_name(out.name + ".tmp")
    save_file({f"{name}.codes": np.ascontiguousarray(mx.pack()),
               f"{name}.scales": np.ascontiguousarray(mx.scales)}, str(tmp), metadata=meta)
    tmp.replace(out)
    if args.json:
        print(json.dumps({"output": str(out), **stats}))
    else:
        print(f"{name}: shape {tuple(x.shape)} {x.dtype} -> MX{mx.fmt.name} "
              f"(scale {args.scale_rule}, {args.rounding}, "
              f"rotation {mx.rotation.name if mx.rotation else 'none'})")
        print(f"  wrote {out}")
        print(f"  relative error        {stats['relative_error']:.6g}")
        print(f"  saturated fraction    {stats['saturated_fraction']:.6g}")
        print(f"  zero-flushed fraction {stats['zero_flushed_fraction']:.6g}")
        print(f"  NaN blocks            {stats['nan_blocks']}")
        print("  scale histogram (exponent: blocks)")
        hist = stats["scale_histogram"]
        peak = max(hist.values()) if hist else 1
        for e, c in hist.items():
            print(f"    {e!s:>5}: {c:>8} {'#' * max(1, round(40 * c / peak))}")
    return 0


def cmd_demo(args) -> int:
    """The CPU main job: quantize a heavy-tailed activation-like tensor with every format and
    the study's rotations, and show how each choice changes the error."""
    from .emulator import quantize
    from .emulator.stats import error_stats
    rng = np.random.default_rng(args.seed)
    x = (rng.standard_normal((args.rows, 4096)) * np.exp(rng.standard_normal((args.rows, 1)))).astype(np.float32)
    x[:, rng.integers(0, 4096, 8)] *= 30.0  # outlier channels, as in LLM activations
    print(f"ocpmx emulator demo: {x.shape} float32 activations with outlier channels")
    print(f"{'format':6} {'scale':6} {'rounding':10} {'rotation':11} {'rel.err':>9} {'saturated':>10} {'flushed':>9}")
    cases = [(f, "floor", "rne", None) for f in ("e4m3", "e5m2", "e3m2", "e2m3", "e2m1", "int8")]
    cases += [("e2m1", rule, "rne", None) for rule in ("rceil", "even", "ceil")]
    cases += [("e2m1", "floor", "stochastic", None), ("e2m1", "floor", "rne", "hadamard16"),
              ("e2m1", "floor", "rne", "hadamard32"), ("e2m1", "even", "rne", "hadamard16")]
    for fmt, rule, rnd, rot in cases:
        mx = quantize(x, fmt, scale_rule=rule, rounding=rnd, rotation=rot, seed=args.seed)
        s = error_stats(x, mx)
        print(f"{fmt:6} {rule:6} {rnd:10} {rot or 'none':11} {s['relative_error']:9.5f} "
              f"{s['saturated_fraction']:10.2e} {s['zero_flushed_fraction']:9.2e}")
    if args.no_train:
        return 0
    try:
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        print("\n(training part skipped: install the train extra, pip install -e '.[train]')")
        return 0
    return _demo_train(args)


def _demo_train(args) -> int:
    """A short CPU pretraining run of the 'tiny' Llama with AMD's MXFP4 recipe on the offline
    corpus (built on first use), then the loss curve."""
    from .llama_train.corpus import build_corpus
    from .llama_train.data import train_tokenizer
    from .llama_train.train import TrainConfig, plot, read_metrics, train
    data = Path(args.data)
    if not (data / "tokenizer.json").is_file():
        print(f"\nbuilding the offline corpus in {data} (Python standard library documentation)")
        build_corpus(data)
        train_tokenizer(data, data / "tokenizer.json", vocab_size=512)
    out = Path(args.out) / "demo-tiny-mxfp4_all_h16"
    print(f"\ntraining 'tiny' with recipe mxfp4_all_h16 for {args.steps} steps on CPU -> {out}")
    train(TrainConfig.from_flat(preset="tiny", recipe="mxfp4_all_h16", data=str(data),
                                out=str(out), max_steps=args.steps, batch_size=8, seq_len=64,
                                warmup_steps=2, eval_every=max(1, args.steps // 2),
                                eval_sequences=8, lr=3e-3, backend="emulator", progress=False,
                                tensorboard=False))
    rows, val = read_metrics(out / "metrics.jsonl")
    for r in rows:
        print(f"step {r['step']:3d}  tokens {r['tokens']:6d}  loss {r['loss']:.4f}  "
              f"lr {r['lr']:.2e}  grad_norm {r['grad_norm']:.3f}")
    for r in val:
        print(f"eval after step {r['step']}: validation loss {r['val_loss']:.4f}")
    print(f"loss plot: {plot([str(out)], str(out / 'loss.png'))}")
    return 0


def cmd_audit(args) -> int:
    from .audit.report import main as audit_main
    return audit_main(args.arch, args.report, args.subset, args.jobs)


def build_parser() -> argparse.ArgumentParser:
    from .spec import FORMATS, ROTATION_NAMES, ROUNDINGS, SCALE_RULES
    from .spec.formats import ALIASES
    p = argparse.ArgumentParser(prog="ocpmx", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    q = sub.add_parser("quantize", help="quantize a .npy/.safetensors tensor to MX and report the error")
    q.add_argument("input")
    q.add_argument("--key", help="tensor name inside a .safetensors file")
    q.add_argument("--format", "-f", default="e2m1", choices=sorted({*FORMATS, *ALIASES}),
                   help="element format: a canonical name or an alias such as mxfp4, mxfp8_e4m3")
    q.add_argument("--axis", type=int, default=-1)
    q.add_argument("--block-size", type=int, default=32)
    q.add_argument("--scale-rule", default="floor", choices=sorted(SCALE_RULES))
    q.add_argument("--rounding", default="rne", choices=sorted(ROUNDINGS))
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--rotation", type=_parse_rotation, default=None,
                   help=", ".join(ROTATION_NAMES))
    q.add_argument("--out", "-o", help="output .safetensors (default: INPUT.<format>.safetensors)")
    q.add_argument("--json", action="store_true", help="print the statistics as one JSON object")
    q.set_defaults(func=cmd_quantize)

    d = sub.add_parser("demo", help="emulator demo on CPU: error of every format, scale rule and rotation")
    d.add_argument("--rows", type=int, default=256)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--no-train", action="store_true", help="only the emulator part")
    d.add_argument("--steps", type=int, default=12, help="training steps of the tiny model")
    d.add_argument("--data", default="data/c4-mini", help="offline corpus directory")
    d.add_argument("--out", default="out", help="run directory root")
    d.set_defaults(func=cmd_demo)

    a = sub.add_parser("audit", help="compile every kernel variant the project launches for a "
                       "chip that is not here and check the code (MX instructions, shared "
                       "memory, spills, no hardware conversions); exit code = verdict")
    a.add_argument("--arch", required=True, choices=["gfx950", "sm_100a"])
    a.add_argument("--report", metavar="PATH",
                   help="write PATH.json and PATH.md (PATH's suffix replaced)")
    a.add_argument("--subset", action="store_true", help="a fast subset (CI)")
    a.add_argument("--jobs", type=int, default=1, help="compile processes (default 1)")
    a.set_defaults(func=cmd_audit)

    from .conformance.cli import add_parser as add_conform
    add_conform(sub)
    try:
        from .llama_train.cli import add_parsers as add_train
    except ImportError:  # torch / tokenizers absent: the train extra is not installed
        pass
    else:
        add_train(sub)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as e:
        print(f"ocpmx {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

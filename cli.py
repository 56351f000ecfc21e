"""The `ocpmx` command line of the OCP Microscaling (MX) v1.0 reference implementation.

  quantize    a .npy/.safetensors tensor to MX with the emulator (the golden model); the error
  dequantize  an `ocpmx quantize` file back to float32, bit for bit as emulator.dequantize
  demo        the emulator on CPU: error of every format, scale rule and rotation
  conform     check a backend (a kernel library, a chip) bit for bit against the emulator
  audit       check the kernels compiled for a chip that is not here
  data, train, ablate, plot, scale-report   pretraining (with the train extra installed)

Bad arguments and unusable inputs exit with status 2 and one line on stderr.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np


class UsageError(Exception):
    """A bad argument or an unusable input: ``main`` prints the one line and exits 2."""


def fail(message: str):
    """Stop the command with a usage error (exit status 2, ``message`` on stderr)."""
    raise UsageError(message)


class _Parser(argparse.ArgumentParser):
    """argparse, with argument errors on one line (the subcommands' parsers are of this class)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parse_rotation(text: str | None):
    from .spec import parse_rotation
    try:
        return parse_rotation(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def format_name(text: str) -> str:
    """argparse type: an element format by name, alias or torch/ml_dtypes dtype name (the table
    ``spec.get_format`` reads) -> its canonical name."""
    from .spec import get_format
    try:
        return get_format(text).name
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return n


# ---- files -------------------------------------------------------------------------------------
# Input tensors: safetensors dtype -> numpy dtype (float16 is widened to float32, exactly).
INPUT_DTYPES = {"F32": "float32", "F64": "float64", "F16": "float16", "BF16": "bfloat16"}
# Codes in safetensors' own dtypes (the default of `ocpmx quantize`); FP6 has none: U8, packed.
NATIVE_CODES = {"e2m1": "F4", "e4m3": "F8_E4M3", "e5m2": "F8_E5M2", "int8": "I8"}


def input_file(text: str) -> Path:
    """The input path, or a usage error saying why it cannot be one."""
    path = Path(text)
    if not path.exists():
        fail(f"{path}: no such file")
    if path.is_dir():
        fail(f"{path} is a directory; name a .npy or .safetensors file")
    if path.suffix not in (".npy", ".safetensors"):
        fail(f"{path}: unsupported input, expected a .npy or .safetensors file")
    return path


def check_output(path: Path, suffixes: tuple[str, ...]) -> None:
    """Fail now, before any work, if ``path`` cannot be written (the message names ``path``)."""
    if path.suffix not in suffixes:
        fail(f"output {path}: expected a {' or '.join(suffixes)} file name")
    if path.is_dir():
        fail(f"output {path} is a directory; name the file to write")
    parent = path.parent
    if not parent.is_dir():
        fail(f"output {path}: {parent} is not a directory" if parent.exists()
             else f"output {path}: the directory {parent} does not exist")
    try:
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError as e:
        fail(f"output {path}: cannot write in {parent}: {e.strerror or e}")


def write_atomic(path: Path, write) -> None:
    """``write(tmp)``, then rename it to ``path``; an OSError becomes a usage error naming ``path``."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        fail(f"cannot write {path}: {e.strerror or e}")


def read_safetensors_header(path: Path) -> tuple[dict, int]:
    """The header of a .safetensors file (tensor entries and '__metadata__') and where its data
    starts; a usage error if the file is not a valid one (safetensors itself checks it)."""
    from safetensors import safe_open
    try:
        with safe_open(str(path), framework="numpy"):
            pass
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
    except Exception as e:  # SafetensorError, OSError, JSONDecodeError: one line, no traceback
        fail(f"{path}: not a valid .safetensors file ({str(e).strip() or type(e).__name__})")
    return header, 8 + n


def read_raw(path: Path, header: dict, start: int, key: str) -> np.ndarray:
    """The bytes of tensor ``key`` (uint8, flat), whatever its dtype."""
    begin, end = header[key]["data_offsets"]
    with open(path, "rb") as f:
        f.seek(start + begin)
        return np.frombuffer(f.read(end - begin), np.uint8)


def write_safetensors(path: Path, tensors: dict, metadata: dict[str, str]) -> None:
    """Write {key: (safetensors dtype, shape, bytes as a uint8 array)} with ``metadata``: any
    dtype safetensors knows (F4, F8_E8M0, ...), without torch. F4's shape counts elements."""
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for key, (dtype, shape, data) in tensors.items():
        blob = np.ascontiguousarray(data).tobytes()
        header[key] = {"dtype": dtype, "shape": [int(s) for s in shape],
                       "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def _choose(path: Path, names: list[str], key: str | None, what: str) -> str:
    if key is None:
        if len(names) == 1:
            return names[0]
        if not names:
            fail(f"{path} holds no {what}")
        fail(f"{path} holds {len(names)} {what}s {names}; choose one with --key")
    if key not in names:
        fail(f"{path} has no {what} {key!r}; --key must be one of {names}")
    return key


def load_tensor(path: Path, key: str | None) -> tuple[np.ndarray, str]:
    """Read a float tensor from .npy or .safetensors (bf16 kept as ml_dtypes.bfloat16, float16
    widened to float32); a usage error for anything else."""
    import ml_dtypes
    if path.suffix == ".npy":
        try:
            x, name = np.load(path, allow_pickle=False), path.stem
        except ValueError as e:
            if "allow_pickle" in str(e):
                fail(f"{path}: holds Python objects (dtype object), not numbers")
            fail(f"{path}: not a valid .npy file ({e})")
        except (OSError, EOFError) as e:
            fail(f"{path}: cannot read it as .npy ({e})")
        dtype = x.dtype.name if x.dtype != ml_dtypes.bfloat16 else "bfloat16"
    else:
        header, start = read_safetensors_header(path)
        name = _choose(path, [k for k in header if k != "__metadata__"], key, "tensor")
        entry = header[name]
        dtype = INPUT_DTYPES.get(entry["dtype"], entry["dtype"])
        if entry["dtype"] in INPUT_DTYPES:
            np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)
            x = read_raw(path, header, start, name).view(np_dtype).reshape(entry["shape"])
    if dtype not in INPUT_DTYPES.values():
        fail(f"{path}: tensor {name!r} has dtype {dtype}; expected float32, float64, float16 "
             f"or bfloat16")
    if x.size == 0:
        fail(f"{path}: tensor {name!r} is empty (shape {tuple(x.shape)})")
    if x.dtype == np.float16:
        x = x.astype(np.float32)  # exact
    return x, name


def mx_entries(mx, name: str, plain_u8: bool) -> tuple[dict, str]:
    """The codes and scales of ``mx`` as safetensors entries, and the codes' layout in words.

    Native (default): F4 for e2m1 (the tensor's shape, two codes per byte along the last axis,
    element 0 in the low nibble, as torch.float4_e2m1fn_x2), F8_E4M3 / F8_E5M2 / I8 one code per
    element, F8_E8M0 scales. FP6 (and FP4 with an odd last dimension): U8 packed along the
    block axis, as with ``plain_u8``, where every code and scale is U8."""
    from .emulator import pack
    dtype = "U8" if plain_u8 else NATIVE_CODES.get(mx.fmt.name, "U8")
    if dtype == "F4" and mx.shape[-1] % 2:
        dtype = "U8"
    if dtype == "F4":
        codes, layout = (mx.shape, pack(mx.codes, mx.fmt)), (
            "F4: the tensor's shape, two codes per byte along the last axis, element 0 in the "
            "low nibble")
    elif dtype == "U8":
        packed = mx.pack()
        codes, layout = (packed.shape, packed), (
            "U8: packed along the block axis; FP4 element 0 in the low nibble; FP6 4 codes per "
            "3 bytes LE; FP8/INT8 one code per byte")
    else:
        codes, layout = (mx.shape, mx.codes), f"{dtype}: one code per element, the tensor's shape"
    scales = ("U8" if plain_u8 else "F8_E8M0", mx.scales.shape, mx.scales)
    return {f"{name}.codes": (dtype, *codes), f"{name}.scales": scales}, layout


def read_mx(path: Path, key: str | None):
    """The MXArray stored by ``ocpmx quantize`` in ``path`` (either storage form, and files of
    earlier versions), its name and the file's metadata."""
    from .emulator import unpack
    from .emulator.interop import from_ml_dtypes
    from .spec import get_format, parse_rotation
    header, start = read_safetensors_header(path)
    meta = header.get("__metadata__") or {}
    names = [k[:-len(".codes")] for k in header
             if k.endswith(".codes") and f"{k[:-len('.codes')]}.scales" in header]
    name = _choose(path, names, key.removesuffix(".codes") if key else None,
                   "MX tensor (NAME.codes and NAME.scales, as ocpmx quantize writes)")
    missing = [k for k in ("format", "axis", "block_size") if k not in meta]
    if missing:
        fail(f"{path}: the metadata lacks {', '.join(missing)} (not written by ocpmx quantize?)")
    fmt, axis, block = get_format(meta["format"]), int(meta["axis"]), int(meta["block_size"])
    rotation = parse_rotation(None if meta.get("rotation", "none") == "none" else meta["rotation"])
    entry, scale_entry = header[f"{name}.codes"], header[f"{name}.scales"]
    dtype, shape = entry["dtype"], entry["shape"]
    raw = read_raw(path, header, start, f"{name}.codes")
    if dtype == "U8":  # packed along the block axis
        packed = raw.reshape(shape)
        codes = np.moveaxis(unpack(np.moveaxis(packed, axis, -1), fmt), -1, axis)
    elif dtype == NATIVE_CODES.get(fmt.name):
        if dtype == "F4":  # the shape counts elements, two per byte along the last axis
            raw = unpack(raw.reshape(*shape[:-1], shape[-1] // 2), fmt)
        codes = raw.reshape(shape)
    else:
        fail(f"{path}: codes of dtype {dtype} do not hold {fmt.name} codes")
    if scale_entry["dtype"] not in ("U8", "F8_E8M0"):
        fail(f"{path}: scales of dtype {scale_entry['dtype']}; expected F8_E8M0 or U8")
    scales = read_raw(path, header, start, f"{name}.scales").reshape(scale_entry["shape"])
    if "shape" in meta and list(codes.shape) != json.loads(meta["shape"]):
        fail(f"{path}: codes of shape {list(codes.shape)}, the metadata says {meta['shape']}")
    mx = from_ml_dtypes(np.ascontiguousarray(codes), scales, axis=axis, block_size=block,
                        rotation=rotation, fmt=fmt)
    return mx, name, meta


# ---- commands ----------------------------------------------------------------------------------
def cmd_quantize(args) -> int:
    from .emulator import quantize
    from .emulator.stats import error_stats

    path = input_file(args.input)
    out = Path(args.out) if args.out else path.with_suffix(f".{args.format}.safetensors")
    check_output(out, (".safetensors",))
    x, name = load_tensor(path, args.key)
    mx = quantize(x, args.format, axis=args.axis, block_size=args.block_size,
                  scale_rule=args.scale_rule, rounding=args.rounding, seed=args.seed,
                  rotation=args.rotation)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # NaN/Inf blocks
        stats = error_stats(x, mx)
    x64 = np.asarray(x, np.float64)
    block_ok = np.repeat(mx.scales != 0xFF, mx.block_size, axis=mx.axis)
    measured = int((np.isfinite(x64) & block_ok).sum())  # the elements the error is taken over
    stats.update(nan_inputs=int(np.isnan(x64).sum()), inf_inputs=int(np.isinf(x64).sum()),
                 error_elements=measured)
    if measured == 0:  # nothing finite to compare: the error is undefined, not 0
        stats["relative_error"] = None
    entries, layout = mx_entries(mx, name, args.plain_u8)
    rotation = mx.rotation.name if mx.rotation else "none"
    meta = {"format": mx.fmt.name, "axis": str(mx.axis), "block_size": str(mx.block_size),
            "scale_rule": args.scale_rule, "rounding": args.rounding, "seed": str(args.seed),
            "rotation": rotation, "shape": json.dumps(list(mx.shape)),
            "storage": "plain_u8" if args.plain_u8 else "native", "packing": layout,
            "scales": "E8M0 codes; the tensor's shape with the block axis divided by block_size"}
    write_atomic(out, lambda tmp: write_safetensors(tmp, entries, meta))
    if args.json:
        print(json.dumps({"output": str(out), **stats}))
        return 0
    print(f"{name}: shape {tuple(x.shape)} {x.dtype} -> MX{mx.fmt.name} "
          f"(scale {args.scale_rule}, {args.rounding}, rotation {rotation})")
    print(f"  wrote {out} ({'plain U8' if args.plain_u8 else 'native dtypes'}: codes "
          f"{entries[f'{name}.codes'][0]}, scales {entries[f'{name}.scales'][0]})")
    rel = stats["relative_error"]
    if rel is None:
        print("  relative error        undefined (no finite input in a finite block)")
    else:
        over = f" (over {measured} of {x64.size} elements)" if measured < x64.size else ""
        print(f"  relative error        {rel:.6g}{over}")
    print(f"  non-finite inputs     {stats['nan_inputs']} NaN, {stats['inf_inputs']} Inf")
    print(f"  saturated fraction    {stats['saturated_fraction']:.6g}")
    print(f"  zero-flushed fraction {stats['zero_flushed_fraction']:.6g}")
    print(f"  NaN blocks            {stats['nan_blocks']}")
    print("  scale histogram (exponent: blocks)")
    hist = stats["scale_histogram"]
    peak = max(hist.values()) if hist else 1
    for e, c in hist.items():
        print(f"    {e!s:>5}: {c:>8} {'#' * max(1, round(40 * c / peak))}")
    return 0


def cmd_dequantize(args) -> int:
    from safetensors.numpy import save_file
    from .emulator import dequantize

    path = input_file(args.input)
    if path.suffix != ".safetensors":
        fail(f"{path}: expected a .safetensors file written by ocpmx quantize")
    out = Path(args.out)
    check_output(out, (".npy", ".safetensors"))
    mx, name, meta = read_mx(path, args.key)
    y = dequantize(mx)
    if out.suffix == ".npy":
        def write(tmp):
            with open(tmp, "wb") as f:
                np.save(f, y)
    else:
        keep = {k: v for k, v in meta.items() if k in ("format", "axis", "block_size", "rotation")}

        def write(tmp):
            save_file({name: np.ascontiguousarray(y)}, str(tmp),
                      metadata={**keep, "source": str(path)})
    write_atomic(out, write)
    rotation = mx.rotation.name if mx.rotation else "none"
    print(f"{name}: MX{mx.fmt.name} shape {tuple(mx.shape)} -> float32, wrote {out}"
          + (f" (still rotated by {rotation})" if mx.rotation else ""))
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
    print(f"\ntraining 'tiny' with recipe mxfp4_all_h16 for {args.steps} steps on CPU -> {out}"
          + (" (replacing the previous demo run there)" if (out / "metrics.jsonl").exists()
             else ""))
    train(TrainConfig.from_flat(preset="tiny", recipe="mxfp4_all_h16", data=str(data),
                                out=str(out), max_steps=args.steps, batch_size=8, seq_len=64,
                                warmup_steps=2, eval_every=max(1, args.steps // 2),
                                eval_sequences=8, lr=3e-3, backend="emulator", progress=False,
                                tensorboard=False), overwrite=True)
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


def _pct(text: str) -> str:
    return text.replace("%", "%%")  # argparse %-formats help texts


def build_parser() -> argparse.ArgumentParser:
    from .spec import FORMATS, ROTATION_NAMES, ROUNDINGS, SCALE_RULES
    from .spec.formats import ALIASES, DTYPE_NAMES
    p = _Parser(prog="ocpmx", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    formats = (f"a name ({', '.join(FORMATS)}), an alias ({', '.join(sorted(ALIASES))}) or a "
               f"torch/ml_dtypes dtype name ({', '.join(sorted(DTYPE_NAMES))})")

    q = sub.add_parser("quantize", help="quantize a .npy/.safetensors tensor to MX and report the error",
                       description="Quantize one tensor with the emulator, write its codes and "
                                   "scales to .safetensors and print the error statistics.")
    q.add_argument("input", help="the tensor: a .npy file or a .safetensors file (float32, "
                                 "float64, float16 or bfloat16)")
    q.add_argument("--key", help="the tensor's name inside a .safetensors file; needed when it "
                                 "holds several (the error lists them)")
    q.add_argument("--format", "-f", default="e2m1", type=format_name, metavar="FORMAT",
                   help=f"element format (default: %(default)s): {formats}")
    q.add_argument("--axis", type=int, default=-1,
                   help="the block axis: blocks of --block-size consecutive elements along it "
                        "share one scale (default: %(default)s, the last axis)")
    q.add_argument("--block-size", type=_positive_int, default=32,
                   help="elements per block; must divide the axis' length "
                        "(default: %(default)s, the spec's k)")
    q.add_argument("--scale-rule", default="floor", choices=list(SCALE_RULES),
                   help="how a block's shared exponent follows from its amax (default: "
                        "%(default)s): " + _pct("; ".join(f"{k}: {v}" for k, v in SCALE_RULES.items()))
                        + ". The default is floor because it is the rule OCP MX v1.0 §6.3 "
                        "gives (the spec allows others); the training recipes use even because "
                        "that is what AMD's kernels (ROCm TransformerEngine, Quark) compute, and "
                        "they reproduce AMD's MLPerf numerics")
    q.add_argument("--rounding", default="rne", choices=list(ROUNDINGS),
                   help="element rounding (default: %(default)s): "
                        + _pct("; ".join(f"{k}: {v}" for k, v in ROUNDINGS.items())))
    q.add_argument("--seed", type=int, default=0,
                   help="the Philox key of --rounding stochastic (default: %(default)s)")
    q.add_argument("--rotation", type=_parse_rotation, default=None, metavar="ROTATION",
                   help=f"block rotation applied along the axis before quantizing, recorded in "
                        f"the metadata (dequantize does not undo it): {', '.join(ROTATION_NAMES)} "
                        f"(default: none)")
    q.add_argument("--out", "-o", metavar="OUT",
                   help="output .safetensors (default: INPUT with the suffix .<format>.safetensors); "
                        "its directory must exist and be writable (checked before any work)")
    q.add_argument("--plain-u8", action="store_true",
                   help="store codes and scales as plain U8 (uint8; codes packed along the block "
                        "axis), as earlier versions wrote, for readers without the newer dtypes. "
                        "Default: safetensors' own dtypes: F4 for e2m1 (two codes per byte along "
                        "the last axis, element 0 in the low nibble, torch.float4_e2m1fn_x2), "
                        "F8_E4M3 / F8_E5M2 for e4m3 / e5m2, I8 for int8, F8_E8M0 scales; FP6 "
                        "stays U8, 4 codes per 3 bytes (torch has no FP6 dtype to load "
                        "safetensors' F6 ones into)")
    q.add_argument("--json", action="store_true",
                   help="print the statistics as one JSON object (relative_error null when "
                        "undefined) instead of the text report")
    q.set_defaults(func=cmd_quantize)

    dq = sub.add_parser("dequantize", help="an `ocpmx quantize` file back to float32 "
                        "(bit for bit as emulator.dequantize)",
                        description="Read codes and scales written by ocpmx quantize (native "
                                    "dtypes or --plain-u8) and write the dequantized float32 "
                                    "tensor. A rotation recorded in the file is not undone.")
    dq.add_argument("input", help="a .safetensors file written by ocpmx quantize")
    dq.add_argument("--out", "-o", required=True, metavar="OUT",
                    help="output file, .npy or .safetensors by its suffix (required)")
    dq.add_argument("--key", help="the tensor's name (NAME of NAME.codes) when the file holds "
                                  "several")
    dq.set_defaults(func=cmd_dequantize)

    d = sub.add_parser("demo", help="emulator demo on CPU: error of every format, scale rule and rotation")
    d.add_argument("--rows", type=_positive_int, default=256,
                   help="rows of the synthetic 4096-wide activation tensor (default: %(default)s)")
    d.add_argument("--seed", type=int, default=0,
                   help="seed of the data and of stochastic rounding (default: %(default)s)")
    d.add_argument("--no-train", action="store_true",
                   help="only the emulator part; default: also a short CPU training run when "
                        "the train extra is installed")
    d.add_argument("--steps", type=_positive_int, default=12,
                   help="training steps of the tiny model (default: %(default)s)")
    d.add_argument("--data", default="data/c4-mini",
                   help="offline corpus directory, built on first use (default: %(default)s)")
    d.add_argument("--out", default="out",
                   help="run directory root; the run goes to OUT/demo-tiny-mxfp4_all_h16 "
                        "(default: %(default)s)")
    d.set_defaults(func=cmd_demo)

    a = sub.add_parser("audit", help="compile every kernel variant the project launches for a "
                       "chip that is not here and check the code (MX instructions, shared "
                       "memory, spills, no hardware conversions); exit code = verdict")
    a.add_argument("--arch", required=True, choices=["gfx950", "sm_100a"],
                   help="the chip: gfx950 (AMD MI355X) or sm_100a (NVIDIA B200) (required)")
    a.add_argument("--report", metavar="PATH",
                   help="write PATH.json and PATH.md (PATH's suffix replaced); checked before "
                        "the audit runs (default: print only)")
    a.add_argument("--subset", action="store_true",
                   help="a fast subset of the variants (CI); default: all of them")
    a.add_argument("--jobs", type=_positive_int, default=1,
                   help="compile processes (default: %(default)s)")
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
    except (UsageError, ValueError, TypeError) as e:
        message = " ".join(str(e).split())  # one line
        print(f"ocpmx {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

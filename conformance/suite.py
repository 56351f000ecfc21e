"""The conformance suite: checks of one backend against the emulator, bit for bit.

Every check ends in one status of a closed set (STATUSES). A failure is reported as one line
per mismatch: the input in hex => got, expected. Known, documented differences of a backend
are listed in ``deviations/<backend>.json`` (and in a user's file, ``--deviations FILE``);
mismatches they explain turn a check into 'deviation' instead of 'fail'.

Reports: ``to_json`` (machine-readable: ``verdict`` pass/deviation/fail/error plus the human
``verdict_text``), ``to_markdown`` (header, verdict, the format x operation summary matrix, the
flat table), ``summary_matrix`` and ``to_table``.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings

from .. import emulator
from ..emulator.accumulate import ChunkedModel
from ..emulator.fold import FoldedModel
from ..spec import BLOCK_SIZE, FORMATS, SCALE_RULES, get_format
from .backends import Backend
from .cli import OPS
from .strategies import THEMES, exactly_summable_operand

STATUSES = ("pass", "fail", "deviation", "not-supported", "error")
BUDGETS = {"quick": dict(examples=8, rules_examples=4, float32_sweep=False),
           "full": dict(examples=60, rules_examples=20, float32_sweep=True)}
MAX_LINES = 5
SPEC_VERSION = "OCP Microscaling Formats (MX) v1.0"
# the verdict's words for people; the JSON's machine-readable ``verdict`` keeps the status names
VERDICT_TEXT = {"pass": "conformant", "deviation": "conformant with documented deviations",
                "fail": "not conformant", "error": "not conformant"}
# worst first: a summary cell shows the worst status among its checks
SEVERITY = ("error", "fail", "deviation", "not-supported", "pass")


@dataclass
class CheckResult:
    check: str
    op: str
    fmt: str
    status: str
    detail: str = ""
    failures: list[str] = field(default_factory=list)
    deviations: list[str] = field(default_factory=list)
    seconds: float = 0.0
    data: dict = field(default_factory=dict)  # structured findings (the accumulation probe's)


class Mismatch(AssertionError):
    """A check's failure lines (``args[0]``); ``shrunk``: whether Hypothesis shrank the example
    (set by ``_property``)."""
    shrunk = True


# ------------------------------------------------------------------------------------------
# Known deviations: declarative rules matched against (input class, got class) of a mismatch
# ------------------------------------------------------------------------------------------

def builtin_deviations_paths(backend: Backend) -> list[Path]:
    """The built-in deviation files of the backend and of the backends it extends (the
    ``triton_gfx950`` backend runs the ``triton`` backend's GEMM and dequantize): those of
    the names along its class hierarchy, base first, that exist."""
    names = []
    for cls in reversed(type(backend).__mro__):
        name = cls.__dict__.get("name")
        if isinstance(name, str) and name not in names:
            names.append(name)
    paths = [Path(__file__).parent / "deviations" / f"{n}.json" for n in names]
    return [p for p in paths if p.is_file()]


DEVIATION_KEYS = {"id": str, "op": str, "formats": list, "input": list, "got": list,
                  "description": str}


def load_deviation_file(path, backend_name: str | None = None) -> list[dict]:
    """The rules of a deviations file (the schema of ``conformance/deviations/*.json``:
    ``{"backend": ..., "source": ..., "deviations": [{"id", "op", "formats", "input", "got",
    "description"[, "capability", "device_contains"]}, ...]}``); a ValueError says what is
    wrong, in one line."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"cannot read the deviations file {path}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"the deviations file {path} is not JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("deviations"), list):
        raise ValueError(f"{path}: expected an object with a list 'deviations'")
    if backend_name is not None and doc.get("backend", backend_name) != backend_name:
        raise ValueError(f"{path} lists deviations of backend {doc['backend']!r}, "
                         f"not of {backend_name!r}")
    for i, r in enumerate(doc["deviations"]):
        where = f"{path}: deviation {i}"
        if not isinstance(r, dict):
            raise ValueError(f"{where} is not an object")
        for key, typ in DEVIATION_KEYS.items():
            if not isinstance(r.get(key), typ):
                raise ValueError(f"{where} ({r.get('id', '?')}): {key!r} must be a "
                                 f"{typ.__name__}")
        if r["op"] not in OPS:
            raise ValueError(f"{where} ({r['id']}): op {r['op']!r} is not one of {', '.join(OPS)}")
        unknown = [f for f in r["formats"] if f not in FORMATS and f != "e8m0"]
        if unknown:
            raise ValueError(f"{where} ({r['id']}): unknown formats {unknown}")
    return doc["deviations"]


def load_deviations(backend: Backend, extra=()) -> list[dict]:
    """The backend's built-in known deviations, then ``extra`` rules (a user's file), keeping
    those that apply to the backend's device and capability."""
    rules = [r for p in builtin_deviations_paths(backend)
             for r in json.loads(p.read_text())["deviations"]]
    rules += list(extra)
    device = str(backend.info().get("device", ""))
    cap = str(backend.info().get("capability", ""))
    return [r for r in rules if r.get("capability", cap) == cap and
            r.get("device_contains", "") in device]


def input_class(x: np.float32, fmt: str, scale_exp: int = 0) -> str:
    if np.isnan(x):
        return "nan"
    if np.isinf(x):
        return "inf"
    if fmt == "e8m0":
        return "finite"
    f = get_format(fmt)
    # past max + half its ulp, round-to-nearest leaves the format: saturation's territory
    if abs(float(x)) * 2.0 ** -scale_exp >= f.max_normal + 2.0 ** (f.emax - f.mbits - 1):
        return "overflow"
    return "finite"


def got_class(code: int, want: int, fmt: str) -> str:
    if fmt == "e8m0":
        return "up" if code == want + 1 else ("down" if code == want - 1 else "other")
    f = get_format(fmt)
    if code in f.nan_codes:
        return "nan"
    if f.inf_code is not None and (code & ~f.sign_bit) == f.inf_code:
        return "inf"
    if f.kind != "int" and (code & ~f.sign_bit) == 0:
        return "zero"
    return "other"


def explain(rules, op, fmt, icls, gcls) -> str | None:
    for r in rules:
        if r["op"] == op and fmt in r["formats"] and icls in r["input"] and gcls in r["got"]:
            return r["id"]
    return None


# ------------------------------------------------------------------------------------------
# Comparisons
# ------------------------------------------------------------------------------------------

def _hex(v) -> str:
    return f"{np.float32(v).view(np.uint32):#010x}"


def _opts_text(opts) -> str:
    """' scale_rule=even rounding=stochastic' (with a leading space), or '' for the defaults."""
    return "".join(f" {k}={v}" for k, v in opts.items())


def compare_codes(op, fmt, x, got, want, rules, found, scale_exp=None):
    """Unexplained mismatch lines; explained ones add their deviation ids to ``found``."""
    got = np.asarray(got)
    if got.shape != want.shape:
        return [f"{op} {fmt}: output shape {got.shape} != {want.shape}"]

    def cases():
        for idx in zip(*np.nonzero(got != want)):
            xi, g, w = x[idx], int(got[idx]), int(want[idx])
            se = 0 if scale_exp is None else int(scale_exp[idx])
            yield (input_class(xi, fmt, se), got_class(g, w, fmt),
                   lambda xi=xi, g=g, w=w: f"{op} {fmt} x={_hex(xi)} ({float(xi):.9g}) => "
                                           f"got {g:#04x}, expected {w:#04x}")
    return unexplained(cases(), op, fmt, rules, found)


def unexplained(cases, op, fmt, rules, found) -> list[str]:
    """Failure lines (at most MAX_LINES) of mismatch cases (input class, got class, line maker);
    a case a known deviation explains adds the deviation's id to ``found`` instead."""
    lines = []
    for icls, gcls, line in cases:
        dev = explain(rules, op, fmt, icls, gcls)
        if dev:
            found.add(dev)
            continue
        lines.append(line())
        if len(lines) >= MAX_LINES:
            break
    return lines


def compare_quantize(fmt, x, got, want, rules, found, opts):
    gc, gs = (np.asarray(a) for a in got)
    wc, ws = want
    if gs.shape != ws.shape or gc.shape != wc.shape:
        return [f"quantize {fmt}: shapes codes {gc.shape} scales {gs.shape}, expected "
                f"{wc.shape} {ws.shape}"]
    axis = opts.get("axis", -1) % x.ndim

    def scale_cases():
        for idx in zip(*np.nonzero(gs != ws)):
            sl = list(idx)
            sl[axis] = slice(idx[axis] * BLOCK_SIZE, (idx[axis] + 1) * BLOCK_SIZE)
            blk = x[tuple(sl)]
            special = not np.isfinite(blk).all()
            amax = np.float32(np.nan) if np.isnan(blk).any() else np.max(np.abs(blk))
            icls = "block_special" if special else ("block_tiny" if amax < 2.0**-120 else "block")
            g, w = int(gs[idx]), int(ws[idx])
            yield (icls, "scale",
                   lambda amax=amax, g=g, w=w: f"quantize {fmt}{_opts_text(opts)} "
                                               f"block amax={_hex(amax)} "
                                               f"({float(amax):.9g}) => scale got {g:#04x}, "
                                               f"expected {w:#04x}")
    lines = unexplained(scale_cases(), "quantize", fmt, rules, found)
    if len(lines) >= MAX_LINES:
        return lines
    # element codes; inside a block whose scale is NaN the element codes are the backend's
    # choice (the spec leaves them open): classed 'in_special_block'
    exp = np.repeat(ws.astype(np.int64) - 127, BLOCK_SIZE, axis=axis)
    in_special = np.repeat(ws == 0xFF, BLOCK_SIZE, axis=axis)
    bad = gc != wc
    if bad.any():
        dev = explain(rules, "quantize", fmt, "in_special_block", "any")
        if dev and (bad & in_special).any():
            found.add(dev)
            gc = np.where(in_special, wc, gc)
    for line in compare_codes("quantize", fmt, x, gc, wc, rules, found, exp):
        lines.append(line.replace("quantize " + fmt, f"quantize {fmt}{_opts_text(opts)}", 1))
    return lines[:MAX_LINES]


# ------------------------------------------------------------------------------------------
# Running one check
# ------------------------------------------------------------------------------------------

def _run(name, op, fmt, backend, body, **supports_opts) -> CheckResult:
    t0 = time.time()
    ok = backend.supports(op, fmt, **supports_opts)
    if ok is not True:
        return CheckResult(name, op, fmt, "not-supported", str(ok))
    found: set[str] = set()
    try:
        lines = body(found)
    except NotImplementedError as e:
        return CheckResult(name, op, fmt, "not-supported", str(e) or f"{op} not implemented",
                           seconds=time.time() - t0)
    except Mismatch as m:
        return CheckResult(name, op, fmt, "fail", _counterexamples(1, m.shrunk),
                           failures=list(m.args[0]), deviations=sorted(found),
                           seconds=time.time() - t0)
    except BaseExceptionGroup as g:  # Hypothesis found several distinct failures
        mism = [e for e in g.exceptions if isinstance(e, Mismatch)]
        if mism:
            return CheckResult(name, op, fmt, "fail",
                               _counterexamples(len(g.exceptions), mism[0].shrunk),
                               failures=[e.args[0][0] for e in mism], deviations=sorted(found),
                               seconds=time.time() - t0)
        e = g.exceptions[0]
        return CheckResult(name, op, fmt, "error", f"{type(e).__name__}: {e}"[:300],
                           seconds=time.time() - t0)
    except Exception as e:  # noqa: BLE001 - any backend error is reported, not raised
        return CheckResult(name, op, fmt, "error", f"{type(e).__name__}: {e}"[:300],
                           seconds=time.time() - t0)
    if lines:
        return CheckResult(name, op, fmt, "fail", "", failures=lines, deviations=sorted(found),
                           seconds=time.time() - t0)
    return CheckResult(name, op, fmt, "deviation" if found else "pass",
                       "" if not found else "differences explained by known deviations",
                       deviations=sorted(found), seconds=time.time() - t0)


def _counterexamples(n: int, shrunk: bool) -> str:
    """A failed property check's detail: how many counterexamples, and whether minimal."""
    kind = "minimal counterexample" if shrunk else "counterexample"
    text = kind if n == 1 else f"{n} distinct {kind}s"
    return f"{text} (Hypothesis{'' if shrunk else ', not shrunk: --no-shrink'})"


def _property(strategy, fn, budget):
    """Run fn on ``budget['examples']`` Hypothesis examples; raise Mismatch with the lines of
    the minimal failing example, or with ``budget['shrink']`` False of the first one found
    (a slow backend spends most of a failing check shrinking)."""
    shrink = budget.get("shrink", True)

    @settings(max_examples=budget["examples"], derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck),
              phases=(Phase.explicit, Phase.generate) + ((Phase.shrink,) if shrink else ()))
    @given(strategy)
    def prop(x):
        lines = fn(x)
        if lines:
            m = Mismatch(lines)
            m.shrunk = shrink
            raise m
    prop()
    return []


def all_bf16_blocks() -> np.ndarray:
    bits = np.arange(1 << 16, dtype=np.uint32) << 16
    x = bits.view(np.float32)
    rng = np.random.default_rng(0)
    ordered = np.sort(x[np.isfinite(x)])
    ordered = ordered[np.linspace(0, ordered.size - 1, x.size // 2).astype(int)]
    return np.concatenate([x[rng.permutation(x.size)][: x.size // 2], ordered]).reshape(-1, BLOCK_SIZE)


# ------------------------------------------------------------------------------------------
# The checks
# ------------------------------------------------------------------------------------------

def cast_checks(backend, formats, budget, rules):
    out = []
    bits = np.arange(1 << 16, dtype=np.uint32) << 16
    x16 = bits.view(np.float32)
    for fmt in formats:
        def body(found, fmt=fmt):
            return compare_codes("cast", fmt, x16, backend.cast(x16, fmt),
                                 emulator.cast(x16, fmt), rules, found)
        out.append(_run(f"cast/all-bf16/{fmt}", "cast", fmt, backend, body))
        if budget["float32_sweep"]:
            out.append(_run(f"cast/all-float32/{fmt}", "cast", fmt, backend,
                            lambda found, fmt=fmt: _float32_sweep(backend, fmt, rules, found)))
    # the E8M0 scale as a cast of positive values (§5.3: 2^floor(log2 v), exact for powers of 2)
    pos = x16[(x16 > 0) & np.isfinite(x16)]

    def e8m0(found):
        return compare_codes("cast", "e8m0", pos, backend.cast(pos, "e8m0"),
                             emulator.cast_scale(pos), rules, found)
    out.append(_run("cast/all-bf16/e8m0", "cast", "e8m0", backend, e8m0))
    return out


def _float32_sweep(backend, fmt, rules, found, chunk=1 << 26):
    for start in range(0, 1 << 32, chunk):
        x = (np.arange(chunk, dtype=np.uint32) + np.uint32(start)).view(np.float32)
        lines = compare_codes("cast", fmt, x, backend.cast(x, fmt), emulator.cast(x, fmt),
                              rules, found)
        if lines:
            return lines
    return []


def quantize_checks(backend, formats, budget, rules):
    out = []
    xb = all_bf16_blocks()
    for fmt in formats:
        for rule in SCALE_RULES:
            opts = dict(scale_rule=rule)

            def body(found, fmt=fmt, opts=opts):
                return compare_quantize(fmt, xb, backend.quantize(xb, fmt, **opts),
                                        _emu_quantize(xb, fmt, opts), rules, found, opts)
            out.append(_run(f"quantize/all-bf16/{fmt}/{rule}", "quantize", fmt, backend, body))
        for theme, strat in THEMES.items():
            for opts in ({}, dict(rounding="stochastic", seed=12345), dict(axis=0)):
                if theme != "random" and opts:
                    continue
                tag = "/".join(f"{v}" for v in opts.values()) or "floor/rne"

                def check(x, fmt=fmt, opts=opts):
                    if opts.get("axis") == 0:
                        x = np.ascontiguousarray(x.T)
                    return compare_quantize(fmt, x, backend.quantize(x, fmt, **opts),
                                            _emu_quantize(x, fmt, opts), rules, set(), opts)

                def body(found, strat=strat, check=check, fmt=fmt):
                    return _property(strat(fmt), check, budget)
                out.append(_run(f"quantize/{theme}/{fmt}/{tag}", "quantize", fmt, backend, body))
    return out


def layout_checks(backend, formats, budget, rules):
    """Packed bytes and scale layout (K-major; FP4 element 0 in the low nibble), rows and
    columns, against the emulator's packing."""
    from .backends import EmulatorBackend
    ref = EmulatorBackend()
    out = []
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((64, 128)) * 4).astype(np.float32)
    for fmt in formats:
        def body(found, fmt=fmt):
            lines = []
            for axis in (-1, 0):
                gd, gs = (np.asarray(a) for a in backend.quantize_packed(x, fmt, axis=axis))
                wd, ws = _expected_layout(backend, ref, x, fmt, axis)
                if gd.shape != wd.shape or gs.shape != ws.shape:
                    return [f"layout {fmt} axis={axis}: packed {gd.shape} scales {gs.shape}, "
                            f"expected {wd.shape} {ws.shape}"]
                for i in np.argwhere(gd != wd)[:MAX_LINES]:
                    lines.append(f"layout {fmt} axis={axis} byte{tuple(int(v) for v in i)} => got "
                                 f"{int(gd[tuple(i)]):#04x}, expected {int(wd[tuple(i)]):#04x}")
                for i in np.argwhere(gs != ws)[:MAX_LINES]:
                    lines.append(f"layout {fmt} axis={axis} scale{tuple(int(v) for v in i)} => got "
                                 f"{int(gs[tuple(i)]):#04x}, expected {int(ws[tuple(i)]):#04x}")
            return lines[:MAX_LINES]
        out.append(_run(f"layout/packed/{fmt}", "layout", fmt, backend, body))
    return out


def _expected_layout(backend, ref, x, fmt, axis):
    """The bytes and scales the layout check expects: the backend's own codes and scales
    (``quantize``) packed as the spec lays them out, so that the check judges where codes go,
    not how values convert (the quantize checks judge that); the emulator's, where the
    backend has no ``quantize``."""
    from .backends import kmajor_packed
    try:
        codes, scales = backend.quantize(x, fmt, axis=axis)
    except NotImplementedError:
        return ref.quantize_packed(x, fmt, axis=axis)
    return kmajor_packed(codes, scales, fmt, axis)


def _emu_quantize(x, fmt, opts):
    mx = emulator.quantize(x, fmt, **opts)
    return mx.codes, mx.scales


# OCP MX v1.0 §5.3 (Table 2/3) values typed by hand, not derived from ocpmx.spec: code -> value
# for the largest normal, smallest normal, smallest subnormal, and the special codes.
SPEC_VALUES = {
    "e4m3": {0x7E: 448.0, 0x08: 2.0**-6, 0x01: 2.0**-9, 0xFE: -448.0, 0x7F: "nan", 0xFF: "nan"},
    "e5m2": {0x7B: 57344.0, 0x04: 2.0**-14, 0x01: 2.0**-16, 0x7C: "inf", 0xFC: "-inf", 0x7D: "nan"},
    "e3m2": {0x1F: 28.0, 0x04: 0.25, 0x01: 0.0625, 0x3F: -28.0},
    "e2m3": {0x1F: 7.5, 0x08: 1.0, 0x01: 0.125, 0x3F: -7.5},
    "e2m1": {0x7: 6.0, 0x2: 1.0, 0x1: 0.5, 0xF: -6.0, 0x8: -0.0},
    "int8": {0x7F: 127 / 64, 0x01: 1 / 64, 0x81: -127 / 64, 0x80: -2.0},
}


def spec_table_checks(backend, formats, budget, rules):
    """Dequantize the spec's landmark codes under scale 2^0 (and 2^-127, 0x00) and compare with
    the values of the spec's tables, typed by hand: this checks the emulator itself too."""
    out = []
    for fmt in formats:
        table = SPEC_VALUES[fmt]

        def body(found, fmt=fmt, table=table):
            codes = np.zeros((2, BLOCK_SIZE), np.uint8)
            codes[:, :len(table)] = np.array(list(table), np.uint8)
            scales = np.array([[127], [0]], np.uint8)
            got = np.asarray(backend.dequantize(codes, scales, fmt), np.float64)
            lines = []
            for j, (code, v) in enumerate(table.items()):
                for row, sc in ((0, 1.0), (1, 2.0**-127)):
                    g = got[row, j]
                    if v == "nan":
                        ok = bool(np.isnan(g))
                    elif v in ("inf", "-inf"):
                        ok = g == (np.inf if v == "inf" else -np.inf)
                    else:
                        want = np.float64(np.float32(v * sc))
                        ok = g == want and np.signbit(g) == np.signbit(want)
                    if not ok:
                        lines.append(f"spec {fmt} code={code:#04x} scale={int(scales[row, 0]):#04x} "
                                     f"=> got {_hex(g)} ({g!r}), expected {v if isinstance(v, str) else repr(np.float32(v * sc))}")
            return lines[:MAX_LINES]
        out.append(_run(f"dequantize/spec-table/{fmt}", "dequantize", fmt, backend, body))
    return out


def dequantize_checks(backend, formats, budget, rules):
    out = []
    for fmt in formats:
        f = get_format(fmt)
        n = 1 << f.bits
        width = max(BLOCK_SIZE, n)
        codes = np.tile(np.arange(width) % n, (256, 1)).astype(np.uint8)
        scales = np.repeat(np.arange(256, dtype=np.uint8)[:, None], width // BLOCK_SIZE, axis=1)

        def body(found, codes=codes, scales=scales, fmt=fmt):
            got = np.asarray(backend.dequantize(codes, scales, fmt), np.float32)
            want = emulator.dequantize(emulator.MXArray(codes, scales, get_format(fmt), 1))
            # bits compared exactly, except that any NaN matches any NaN (IEEE 754 leaves the
            # payload of a produced NaN to the implementation)
            bad = np.argwhere((got.view(np.uint32) != want.view(np.uint32)) &
                              ~(np.isnan(got) & np.isnan(want)))
            return [f"dequantize {fmt} code={codes[tuple(i)]:#04x} scale={scales[i[0], i[1] // BLOCK_SIZE]:#04x}"
                    f" => got {_hex(got[tuple(i)])}, expected {_hex(want[tuple(i)])}"
                    for i in bad[:MAX_LINES]]
        out.append(_run(f"dequantize/every-code-every-scale/{fmt}", "dequantize", fmt, backend, body))
    return spec_table_checks(backend, formats, budget, rules) + out


# ---- GEMM -----------------------------------------------------------------------------------

def _operand(codes_vals, fmt, scales=None):
    """K-major operand (rows, K) from element values (exactly representable) and scales."""
    v = np.atleast_2d(np.asarray(codes_vals, np.float32))
    codes = emulator.cast(v, fmt)
    if scales is None:
        scales = np.full((v.shape[0], v.shape[1] // BLOCK_SIZE), 127, np.uint8)
    return codes, np.asarray(scales, np.uint8)


def _dot(backend, a_vals, b_vals, fmt="e4m3", a_scales=None, b_scales=None):
    ac, as_ = _operand(a_vals, fmt, a_scales)
    bc, bs = _operand(b_vals, fmt, b_scales)
    return float(np.asarray(backend.gemm(ac, as_, bc, bs, fmt, fmt))[0, 0])


def probe_accumulation(backend, k=256) -> dict:
    """Infer the backend's accumulation from designed e4m3 dot products of length k (Fasi et
    al.'s method): alignment bits F, truncation or rounding at alignment, products fused per
    step L, where the scale is applied, what E8M0 0x00 and 0xFF decode to."""
    out = {}
    one = np.zeros(k, np.float32)

    def vec(pairs):
        a, b = one.copy(), one.copy()
        for pos, (x, y) in pairs.items():
            a[pos], b[pos] = x, y
        return a, b

    # E8M0 0x00 and 0xFF: 1.0 * 1.0 under scale code 0 (2^-127) / 0xFF (NaN)
    a, b = vec({0: (1.0, 1.0)})
    sa = np.full((1, k // BLOCK_SIZE), 127, np.uint8)
    sa[0, 0] = 0
    v = _dot(backend, a, b, a_scales=sa)
    out["e8m0_0x00"] = "2^-127" if v == 2.0**-127 else ("0" if v == 0 else repr(v))
    sa[0, 0] = 255
    v = _dot(backend, a, b, a_scales=sa)
    out["e8m0_0xff"] = "NaN" if np.isnan(v) else repr(v)
    # where the scale is applied: 2^-9 (e4m3 min subnormal) under 2^-127 is 2^-136, below
    # bf16's range (2^-133) but a float32 subnormal: lost if scaled operands are bf16
    a, b = vec({0: (2.0**-9, 1.0)})
    sa = np.full((1, k // BLOCK_SIZE), 127, np.uint8)
    sa[0, 0] = 0
    v = _dot(backend, a, b, a_scales=sa)
    out["scale_applied"] = ("to the products or the sum (2^-136 kept)" if v == 2.0**-136 else
                            f"to bf16 operands (2^-136 became {v!r})")
    # alignment bits F: 2^16 + 2^(16-t) - 2^16 in one block: kept iff t <= F
    kept = 0
    for t in range(1, 35):
        x = 16 - t
        ea, eb = max(-9, x - 8), None
        eb = x - ea
        if not -9 <= eb <= 8:
            break
        a, b = vec({0: (256.0, 256.0), 1: (2.0**ea, 2.0**eb), 2: (-256.0, 256.0)})
        if _dot(backend, a, b) == 2.0**x:
            kept = t
        else:
            break
    out["alignment_bits"] = kept
    f_bits = kept
    # truncation or rounding: 0.75 of the quantum 2^(16-F) is kept as 0 (truncate) or 1 quantum
    p = max(-6, (15 - f_bits) - 8)
    q = 15 - f_bits - p
    if -9 <= q <= 8:
        a, b = vec({0: (256.0, 256.0), 1: (1.5 * 2.0**p, 2.0**q), 2: (-256.0, 256.0)})
        v = _dot(backend, a, b)
        out["alignment_rounding"] = ("truncate" if v == 0 else "rne" if v == 2.0**(16 - f_bits)
                                     else f"exact-or-wider (got {v!r})")
    # products per step L: -2^16 moved away from +2^16 and a small 2^(16-F) term; once it sits in
    # another chunk the small term must pass through a float32 partial sum (F > 23 only)
    if 23 < f_bits < 34:
        x = 16 - f_bits
        ea = max(-9, x - 8)
        chunk = None
        for j in range(2, k):
            a, b = vec({0: (256.0, 256.0), 1: (2.0**ea, 2.0**(x - ea)), j: (-256.0, 256.0)})
            if _dot(backend, a, b) != 2.0**x:
                chunk = j
                break
        out["products_per_step"] = chunk if chunk is not None else f">= {k}"
    else:
        out["products_per_step"] = "not observable (F <= 23 or exact)"
    return out


def describe_probe(p: dict) -> str:
    """The probe's findings as one readable line, e.g. 'alignment bits 25, truncate, 16 products
    per step; E8M0 0x00 = 0 (spec: 2^-127), 0xFF = NaN; scale applied to bf16 operands ...'."""
    acc = [f"alignment bits {p.get('alignment_bits', '?')}"]
    if "alignment_rounding" in p:
        acc.append(str(p["alignment_rounding"]))
    steps = p.get("products_per_step")
    acc.append(f"{steps} products per step" if isinstance(steps, int)
               else f"products per step {steps}")
    e00, eff = p.get("e8m0_0x00", "?"), p.get("e8m0_0xff", "?")
    e8m0 = (f"E8M0 0x00 = {e00}" + ("" if e00 == "2^-127" else " (spec: 2^-127)") +
            f", 0xFF = {eff}" + ("" if eff == "NaN" else " (spec: NaN)"))
    text = f"{', '.join(acc)}; {e8m0}"
    if "scale_applied" in p:
        text += f"; scale applied {p['scale_applied']}"
    return text


def model_from_probe(p: dict):
    f_bits = p.get("alignment_bits", 0)
    if f_bits >= 34:
        return "exact"
    chunk = p.get("products_per_step")
    if not isinstance(chunk, int):
        return "fp32_sequential"
    align = "truncate" if p.get("alignment_rounding") == "truncate" else "rne"
    return ChunkedModel(chunk, f_bits, align, "rtz")


FOLD_PROBE_K = 2048  # 64 blocks: fold groups up to 64 blocks (a whole row) tell apart


def _fold_dot(backend, a_vals, a_scale_exp, b_vals, fmt="e2m1"):
    """A 1 x 1 GEMM of length FOLD_PROBE_K: a's elements {position: value} with per-block scale
    exponents {block: e} (others 0), b's {position: value} under scale 1."""
    a, b = np.zeros(FOLD_PROBE_K, np.float32), np.zeros(FOLD_PROBE_K, np.float32)
    for pos, v in a_vals.items():
        a[pos] = v
    for pos, v in b_vals.items():
        b[pos] = v
    sa = np.full((1, FOLD_PROBE_K // BLOCK_SIZE), 127, np.uint8)
    for blk, e in a_scale_exp.items():
        sa[0, blk] = 127 + e
    ac, as_ = _operand(a, fmt, sa)
    bc, bs = _operand(b, fmt, None)
    return float(np.asarray(backend.gemm(ac, as_, bc, bs, fmt, fmt))[0, 0])


def probe_folding(backend) -> dict:
    """Infer how a backend that runs FP4/FP6 GEMMs on FP8 tensor cores folds and sums
    (``emulator.fold``), from designed E2M1 (and, where the backend takes it, E3M2) dot
    products of length 2048:

    group      a product 2^-19 below another, its block scaled 2^-20 below: lost where both
               blocks share a fold group (the far block rounds to zero), kept in float32
               otherwise; the first block distance (1, 2, 4, ..., 64) that keeps it is the
               group (1: no rounding across blocks, as an unfolded backend);
    chained    a product 2^-17 below the one before it, in the next block of the same group
               (both fold exactly): kept when each K = 32 dot leaves the tensor core alone
               (promoted) or the dots are exact, lost when the running sum takes part in the
               next dot's alignment (Hopper's chained wgmma);
    chain      (chained) the same small product at block distance 2, 4, ... inside the group:
               the first distance that keeps it is the span of blocks chained in the tensor
               core before its sum is added in float32 (cuBLAS's rowwise FP8 GEMM: 4); None
               where the whole group is one chain;
    dot        (E3M2) two products 2^-17.6 apart in one block: kept by an exact dot, lost by
               one that truncates to 13 bits below the largest (Hopper's FP8 wgmma)."""
    out = {}
    group = None
    for j in (1, 2, 4, 8, 16, 32):
        # a: 0.5 in block 0 (scale 1), 0.5 in block j (scale 2^-20); b: 0.5 and 1
        v = _fold_dot(backend, {0: 0.5, 32 * j: 0.5}, {j: -20}, {0: 0.5, 32 * j: 1.0})
        if v == 0.25 + 2.0**-21:
            group = j
            break
        if v != 0.25:
            raise ValueError(f"fold probe: block distance {j} gave {v!r}, neither the sum "
                             f"{0.25 + 2.0**-21!r} nor 0.25")
    out["group"] = group if group is not None else 64
    g = out["group"]
    if g >= 2:
        # a: 4 in block 0 (scale 1), 0.5 in block 1 (scale 2^-12): products 16 and 2^-13
        v = _fold_dot(backend, {0: 4.0, 32: 0.5}, {1: -12}, {0: 4.0, 32: 1.0})
        out["chained"] = {16.0 + 2.0**-13: False, 16.0: True}.get(v, f"neither ({v!r})")
    else:
        out["chained"] = "not observable (group 1)"
    if out["chained"] is True:
        out["chain"] = None
        for j in (2, 4, 8, 16, 32):
            if j >= g:
                break
            v = _fold_dot(backend, {0: 4.0, 32 * j: 0.5}, {j: -12}, {0: 4.0, 32 * j: 1.0})
            if v == 16.0 + 2.0**-13:
                out["chain"] = j
                break
    if backend.supports("gemm", "e3m2") is True:
        # E3M2: 28 x 28 = 784 and 0.0625 x 0.0625 = 2^-8 in block 0
        v = _fold_dot(backend, {0: 28.0, 1: 0.0625}, {}, {0: 28.0, 1: 0.0625}, "e3m2")
        out["dot"] = {784.0 + 2.0**-8: "exact", 784.0: "hopper"}.get(v, f"neither ({v!r})")
    else:
        out["dot"] = "not observable (no e3m2 GEMM)"
    if out["chained"] is True:
        out["dot"] = "hopper"  # a chained exact dot keeps the product: the chain truncates
    return out


def model_from_fold_probe(p: dict):
    """The FoldedModel the probe's findings describe, or None where no fold is observed
    (group 1 and exact dots: the blocks' sums, fp32_sequential's)."""
    dot = p.get("dot") if p.get("dot") in ("exact", "hopper") else "exact"
    if p["group"] == 1 and dot == "exact":
        return None
    return FoldedModel(p["group"], p.get("chained") is True, dot, p.get("chain"))


def _run_probe(backend, check, fmt, probe_fn):
    """(findings, seconds, None) of ``probe_fn(backend)``, or (None, 0, [the CheckResult]) where
    the backend does not take ``fmt`` GEMMs or the probe raises."""
    ok = backend.supports("gemm", fmt)
    if ok is not True:
        return None, 0.0, [CheckResult(check, "gemm", fmt, "not-supported", str(ok))]
    t0 = time.time()
    try:
        probe = probe_fn(backend)
    except NotImplementedError as e:
        return None, 0.0, [CheckResult(check, "gemm", fmt, "not-supported", str(e))]
    except Exception as e:  # noqa: BLE001
        return None, 0.0, [CheckResult(check, "gemm", fmt, "error", f"{type(e).__name__}: {e}")]
    return probe, time.time() - t0, None


def _fold_probe_checks(backend, rules):
    probe, dt, stop = _run_probe(backend, "gemm/probe/fold", "e2m1", probe_folding)
    if stop:
        return stop
    model = model_from_fold_probe(probe)
    out = [CheckResult("gemm/probe/fold", "gemm", "e2m1", "pass",
                       f"inferred: fold group {probe['group']} blocks, chained {probe['chained']},"
                       f" dot {probe['dot']}; model: {model}", seconds=dt, data=probe)]
    if model is None:
        return out
    # the emulator configured with the inferred model must reproduce the backend on random data
    rng = np.random.default_rng(8)
    fmts = ["e2m1"] + (["e3m2"] if backend.supports("gemm", "e3m2") is True else [])
    cases = []
    for fmt in fmts:
        x = rng.standard_normal((32, 1024)) * np.exp(rng.normal(0, 2, (32, 32))).repeat(32, 1)
        a = emulator.quantize(x.astype(np.float32), fmt)
        b = emulator.quantize(rng.standard_normal((32, 1024)).astype(np.float32), fmt)
        got = np.asarray(backend.gemm(a.codes, a.scales, b.codes, b.scales, fmt, fmt), np.float32)
        cases.append((a, b, got))
    closeness = {str(model): model_closeness(cases, model)}
    bad, total = closeness[str(model)]["differ"], closeness[str(model)]["outputs"]
    if bad:
        closeness.update({str(m): model_closeness(cases, m) for m in FOLD_CANDIDATES})
    dev = explain(rules, "gemm", "e2m1", "fold-model", "not-reproduced")
    status = "pass" if bad == 0 else ("deviation" if dev else "fail")
    detail = (f"emulator with {model}: {total - bad} of {total} outputs bit-equal "
              f"({', '.join(fmts)}, blocks far apart)")
    if bad:
        best = min(closeness, key=lambda k: (closeness[k]["differ"], closeness[k]["max_ulp"]))
        c = closeness[best]
        detail += (f"; closest model {best}: {c['outputs'] - c['differ']} bit-equal, the rest "
                   f"within {c['max_ulp']} ulp")
    out.append(CheckResult("gemm/fold-model-reproduces-backend", "gemm", "e2m1", status, detail,
                           deviations=[dev] if dev and status == "deviation" else [],
                           data={"closeness": closeness}))
    return out


# models the fold check also scores a backend against when its inferred model misses
FOLD_CANDIDATES = ("exact", "fp32_sequential", "hopper_fp8_exact", "hopper_fp8_chained",
                   FoldedModel(4, True), FoldedModel(4, False), FoldedModel(4, True, "exact"))


def ulp_distance(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in float32 ulps: the distance between the two bit patterns on the ordered
    integer line (+0 and -0 one apart); NaN against NaN is 0, NaN against a number 2^32."""
    def ordered(v):
        i = np.asarray(v, np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF) - 1, i)
    d = np.abs(ordered(got) - ordered(want))
    gn, wn = np.isnan(got), np.isnan(want)
    return np.where(gn & wn, 0, np.where(gn | wn, 2**32, d))


def model_closeness(cases, model) -> dict:
    """How near ``model`` comes to a backend on ``cases`` [(a, b, backend's output)]: outputs,
    outputs whose bits differ, and the largest and mean distance in ulps."""
    d = np.concatenate([ulp_distance(got, emulator.mx_matmul(a, b, model)).ravel()
                        for a, b, got in cases])
    return {"outputs": int(d.size), "differ": int((d != 0).sum()), "max_ulp": int(d.max()),
            "mean_ulp": float(d.mean())}


def gemm_checks(backend, formats, budget, rules):
    from hypothesis import strategies as st
    out = []
    pairs = [(a, b) for a in formats for b in formats
             if a in ("e2m1", "e4m3", "e5m2") and b in ("e2m1", "e4m3", "e5m2")]
    for fa, fb in pairs:
        @st.composite
        def exact_inputs(draw, fa=fa, fb=fb):
            m, n = draw(st.integers(1, 24)), draw(st.integers(1, 24))
            k = BLOCK_SIZE * draw(st.integers(1, 8))
            rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
            return [exactly_summable_operand(rng, r, k, f) for r, f in ((m, fa), (n, fb))]

        def check(ops, fa=fa, fb=fb):
            (ac, as_), (bc, bs) = ops
            got = np.asarray(backend.gemm(ac, as_, bc, bs, fa, fb), np.float32)
            want = emulator.mx_matmul(emulator.MXArray(ac, as_, get_format(fa), 1),
                                      emulator.MXArray(bc, bs, get_format(fb), 1), "exact")
            bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
            return [f"gemm {fa}x{fb} exactly summable, K={ac.shape[1]} out[{i[0]},{i[1]}] => got "
                    f"{_hex(got[tuple(i)])}, expected {_hex(want[tuple(i)])}" for i in bad[:MAX_LINES]]

        def body(found, strat=exact_inputs, check=check):
            return _property(strat(), check, budget)
        out.append(_run(f"gemm/exactly-summable/{fa}x{fb}", "gemm", fa, backend, body))
    if "e4m3" in formats:
        out.extend(_probe_checks(backend, rules))
    if "e2m1" in formats:
        out.extend(_fold_probe_checks(backend, rules))
    return out


def _probe_checks(backend, rules):
    out = []
    probe, dt, stop = _run_probe(backend, "gemm/probe", "e4m3", probe_accumulation)
    if stop:
        return stop
    detail = describe_probe(probe)
    for key, want in (("e8m0_0x00", "2^-127"), ("e8m0_0xff", "NaN")):
        dev = explain(rules, "gemm", "e4m3", key, probe[key])
        status = "pass" if probe[key] == want else ("deviation" if dev else "fail")
        out.append(CheckResult(f"gemm/probe/{key}", "gemm", "e4m3", status,
                               f"decodes as {probe[key]} (spec: {want})",
                               failures=[] if status != "fail" else
                               [f"gemm e4m3 1.0 x 1.0 under scale {key[-4:]} => got {probe[key]}, expected {want}"],
                               deviations=[dev] if dev and status == "deviation" else [],
                               seconds=dt))
    model = model_from_probe(probe)
    out.append(CheckResult("gemm/probe/accumulation", "gemm", "e4m3", "pass",
                           f"inferred: {detail}; model: {model}", seconds=dt, data=probe))
    # the emulator configured with the inferred model must reproduce the backend on random data
    rng = np.random.default_rng(7)
    a = emulator.quantize(rng.standard_normal((64, 1024)).astype(np.float32), "e4m3")
    b = emulator.quantize(rng.standard_normal((48, 1024)).astype(np.float32), "e4m3")
    got = np.asarray(backend.gemm(a.codes, a.scales, b.codes, b.scales, "e4m3", "e4m3"), np.float32)
    want = emulator.mx_matmul(a, b, model)
    frac = float(np.mean(got.view(np.uint32) == want.view(np.uint32)))
    dev = explain(rules, "gemm", "e4m3", "model", "not-reproduced")
    status = "pass" if frac == 1.0 else ("deviation" if dev else "fail")
    out.append(CheckResult("gemm/model-reproduces-backend", "gemm", "e4m3", status,
                           f"emulator with {model}: {frac:.4%} of 3072 outputs bit-equal",
                           deviations=[dev] if dev and status == "deviation" else []))
    return out


# ------------------------------------------------------------------------------------------

SECTIONS = {"cast": cast_checks, "quantize": quantize_checks, "dequantize": dequantize_checks,
            "layout": layout_checks, "gemm": gemm_checks}
assert tuple(SECTIONS) == OPS


def run_suite(backend: Backend, formats=tuple(FORMATS), budget="quick", ops=None,
              progress=None, extra_deviations=(), shrink=True) -> list[CheckResult]:
    """Run the checks of ``ops`` (default all: cast, quantize, dequantize, layout, gemm);
    ``extra_deviations``: known-deviation rules of the user's (``load_deviation_file``), added
    to the backend's built-in ones. ``shrink``: a failing property check reports Hypothesis's
    minimal counterexample (default), or with False the first one it found (quicker where the
    backend is slow)."""
    ops = tuple(SECTIONS) if ops is None else tuple(ops)
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; expected one of {tuple(BUDGETS)}")
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"unknown formats {unknown}; expected some of {tuple(FORMATS)}")
    rules = load_deviations(backend, extra_deviations)
    results = []
    for op in ops:
        for r in SECTIONS[op](backend, list(formats), dict(BUDGETS[budget], shrink=shrink),
                              rules):
            results.append(r)
            if progress:
                progress(r)
    return results


def verdict(results) -> str:
    statuses = {r.status for r in results}
    for s in ("error", "fail"):
        if s in statuses:
            return s
    return "deviation" if "deviation" in statuses else "pass"


def counts(results) -> dict:
    return {s: sum(r.status == s for r in results) for s in STATUSES}


def counts_text(c: dict) -> str:
    """'120 pass, 1 deviation, 1 not-supported' (statuses with no checks left out)."""
    return ", ".join(f"{n} {s}" for s, n in c.items() if n) or "no checks"


def verdict_text(results) -> str:
    return VERDICT_TEXT[verdict(results)]


def to_json(results, header) -> dict:
    return {"header": header, "verdict": verdict(results), "verdict_text": verdict_text(results),
            "counts": counts(results), "checks": [asdict(r) for r in results]}


def suite_commit() -> str:
    """The commit the suite runs from: ``OCPMX_COMMIT`` where set (a copy of a working tree
    without its history, as on a lent GPU machine), else ``git rev-parse --short HEAD`` in the
    package's directory with "-dirty" where tracked files differ from it, else 'unknown'."""
    if os.environ.get("OCPMX_COMMIT"):
        return os.environ["OCPMX_COMMIT"]
    root = Path(__file__).resolve().parent.parent
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root,
                               capture_output=True, timeout=30).returncode == 1
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    commit = done.stdout.strip()
    if done.returncode != 0 or not commit:
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def header_text(value) -> str:
    """A header value as text: lists joined with spaces, the rest as is."""
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


def summary_matrix(results, formats=None) -> str:
    """Markdown table: rows formats, columns the operations (cast, quantize, dequantize, layout,
    gemm); each cell the worst status of that slice's checks ('-' where none ran)."""
    rows = list(formats or [])
    rows += [f for f in dict.fromkeys(r.fmt for r in results) if f not in rows]
    lines = ["| format | " + " | ".join(OPS) + " |", "|---" * (len(OPS) + 1) + "|"]
    for fmt in rows:
        cells = []
        for op in OPS:
            got = {r.status for r in results if r.fmt == fmt and r.op == op}
            cells.append(next((s for s in SEVERITY if s in got), "-"))
        lines.append(f"| {fmt} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def to_markdown(results, header, backend_name: str) -> str:
    """The Markdown report: header, verdict, the summary matrix, the flat table."""
    head = "\n".join(f"- {k}: `{header_text(v)}`" for k, v in header.items())
    return (f"# Conformance: {backend_name}\n\n{head}\n\n"
            f"verdict: **{verdict_text(results)}** ({counts_text(counts(results))}; "
            f"machine-readable verdict: `{verdict(results)}`)\n\n"
            f"## Summary (worst status per format and operation)\n\n"
            f"{summary_matrix(results, header.get('formats'))}\n\n"
            f"## Checks\n\n{to_table(results)}\n")


def to_table(results) -> str:
    lines = ["| check | status | detail |", "|---|---|---|"]
    for r in results:
        detail = r.detail
        if r.failures:
            detail = (detail + "; " if detail else "") + r.failures[0]
        if r.deviations:
            detail += f" [{', '.join(r.deviations)}]"
        lines.append(f"| {r.check} | {r.status} | {detail.replace('|', '/')} |")
    return "\n".join(lines)

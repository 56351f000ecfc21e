"""The conformance suite catches planted faults, passes the emulator, and its CLI and plug-in
loading work."""
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from ocpmx import cli, emulator
from ocpmx.conformance import load_backend, run_suite, verdict
from ocpmx.conformance.backends import EmulatorBackend
from ocpmx.conformance.suite import (CheckResult, describe_probe, input_class, summary_matrix,
                                     to_json)
from ocpmx.emulator.decode import decode_table
from ocpmx.spec import get_format


def grid_round(y, fmt, ties_away=False):
    """Magnitude codes of |y| (float64, already divided by the scale) on the format's grid:
    nearest, ties to even or away from zero; saturating. An independent, slow reference."""
    f = get_format(fmt)
    g = np.array([decode_table(f)[c] for c in range(f.max_code + 1)])
    lo = np.clip(np.searchsorted(g, y, side="right") - 1, 0, len(g) - 1)
    hi = np.minimum(lo + 1, len(g) - 1)
    dlo, dhi = y - g[lo], g[hi] - y
    tie = dlo == dhi
    pick_hi = (dhi < dlo) | (tie & (ties_away | (lo % 2 == 1)))
    return np.where(y >= g[-1], len(g) - 1, np.where(pick_hi, hi, lo))


class Faulty(EmulatorBackend):
    """Quantize with a chosen scale exponent and rounding (float formats, finite blocks)."""

    name = "faulty"
    ties_away = False

    def scale_exp(self, amax, fmt):
        f = get_format(fmt)
        return np.floor(np.log2(amax.astype(np.float64))) - f.emax

    def quantize(self, x, fmt, axis=-1, block_size=32, scale_rule="floor", rounding="rne", seed=0):
        ref = emulator.quantize(x, fmt, axis=axis, block_size=block_size, scale_rule=scale_rule,
                                rounding=rounding, seed=seed)
        if scale_rule != "floor" or rounding != "rne":  # the faults live in floor + RNE
            return ref.codes, ref.scales
        xm = np.moveaxis(x, axis, -1)
        with np.errstate(invalid="ignore"):
            blocks = xm.reshape(*xm.shape[:-1], -1, block_size).astype(np.float64)
        amax = np.abs(blocks).max(-1)
        ok = np.isfinite(amax) & (amax > 0)
        s = np.where(ok, self.scale_exp(np.where(ok, amax, 1.0), fmt), -127).clip(-127, 127)
        y = np.abs(blocks) / 2.0 ** s[..., None]
        mag = grid_round(np.nan_to_num(y), fmt, self.ties_away)
        f = get_format(fmt)
        codes = (mag | np.where(np.signbit(blocks), f.sign_bit, 0)).astype(np.uint8)
        codes = np.moveaxis(codes.reshape(xm.shape), -1, axis)
        scales = np.moveaxis((s + 127).astype(np.uint8), -1, axis)
        keep = ~np.repeat(np.moveaxis(ok, -1, axis), block_size, axis=axis)
        codes = np.where(keep, ref.codes, codes)
        return codes, np.where(np.moveaxis(ok, -1, axis), scales, ref.scales)


class TiesAway(Faulty):
    ties_away = True


class Float32Log2(Faulty):
    def scale_exp(self, amax, fmt):
        return np.floor(np.log2(amax.astype(np.float32))).astype(np.float64) - get_format(fmt).emax


class CeilRule(EmulatorBackend):
    def quantize(self, x, fmt, **opts):
        opts["scale_rule"] = "ceil"
        return super().quantize(x, fmt, **opts)


class NibbleSwap(EmulatorBackend):
    def quantize_packed(self, x, fmt, axis=-1, **opts):
        data, scales = super().quantize_packed(x, fmt, axis=axis, **opts)
        return ((data >> 4) | (data << 4)).astype(np.uint8), scales


def statuses(results, prefix):
    return {r.check: r.status for r in results if r.check.startswith(prefix)}


def test_the_faithful_faulty_base_passes():
    """The fault injection machinery itself is faithful when no fault is planted."""
    res = run_suite(Faulty(), ["e2m1", "e4m3"], ops=["quantize"])
    bad = [(r.check, r.failures[:1]) for r in res if r.status != "pass"]
    assert not bad


@pytest.mark.parametrize("backend,prefix,needle,shrink", [
    (TiesAway(), "quantize/", "quantize e2m1", True),
    (Float32Log2(), "quantize/scale_boundaries", "scale got", False),
    (CeilRule(), "quantize/", "scale got", False),
    (NibbleSwap(), "layout/", "layout e2m1", True),
])
def test_planted_faults_are_reported_as_failures(backend, prefix, needle, shrink):
    """Each planted fault fails the checks of its operation, with a line naming the element,
    what the backend gave and what the spec expects. The slow faulty backends (their quantize
    is pure NumPy) report the first counterexample found, unshrunk (``shrink=False``: shrinking
    took most of a minute), and say so."""
    res = run_suite(backend, ["e2m1"], ops=[prefix.split("/")[0]], shrink=shrink)
    st = statuses(res, prefix)
    assert "fail" in st.values(), st
    fails = [r for r in res if r.status == "fail"]
    assert verdict(res) == "fail"
    line = fails[0].failures[0]
    assert needle in line and "=> " in line and "got" in line and "expected" in line and "0x" in line
    if prefix.startswith("quantize"):  # (the layout checks are not Hypothesis properties)
        hyp = [r.detail for r in fails if "(Hypothesis" in r.detail]
        assert hyp and all(("minimal" in d) == shrink and ("not shrunk" in d) != shrink
                           for d in hyp)


def test_emulator_backend_passes_everything():
    res = run_suite(EmulatorBackend(), ["e2m1", "e4m3", "int8"])
    assert verdict(res) == "pass", [(r.check, r.failures[:1], r.detail) for r in res if r.status != "pass"]
    assert {r.op for r in res} == {"cast", "quantize", "dequantize", "layout", "gemm"}


def test_ml_dtypes_deviations_are_named_not_hidden():
    res = run_suite(load_backend("ml_dtypes"), ["e2m1", "e4m3", "e5m2"], ops=["cast"])
    by = {r.check: r for r in res}
    assert by["cast/all-bf16/e4m3"].status == "deviation"
    assert by["cast/all-bf16/e4m3"].deviations == ["e4m3-no-saturation"]
    assert by["cast/all-bf16/e2m1"].deviations == ["fp4-fp6-nan-to-zero"]
    assert by["cast/all-bf16/e8m0"].deviations == ["e8m0-round-to-nearest"]
    assert all(r.status in ("deviation", "pass", "not-supported") for r in res)


def test_input_classes():
    assert input_class(np.float32(464.0), "e4m3") == "overflow"   # the tie above 448
    assert input_class(np.float32(463.9), "e4m3") == "finite"
    assert input_class(np.float32(61440.0), "e5m2") == "overflow"
    assert input_class(np.float32(np.nan), "e2m1") == "nan"


def test_backend_loading(tmp_path, monkeypatch):
    f = tmp_path / "mybackend.py"
    f.write_text(textwrap.dedent("""
        from ocpmx.conformance.backends import EmulatorBackend
        class Mine(EmulatorBackend):
            name = "mine"
    """))
    assert load_backend(f"{f}:Mine").name == "mine"
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_backend("mybackend:Mine").name == "mine"
    with pytest.raises(LookupError, match="unknown backend 'nope'"):
        load_backend("nope")
    with pytest.raises(LookupError, match="has no class Other"):
        load_backend(f"{f}:Other")
    from ocpmx.conformance import backends
    monkeypatch.setitem(backends.PEERS, "gfloat", "no_such_package_for_ocpmx")
    with pytest.raises(LookupError, match="'no_such_package_for_ocpmx' is not installed"):
        load_backend("gfloat")


def test_cli_exit_status_and_report(tmp_path):
    report = tmp_path / "r.json"
    code = cli.main(["conform", "--backend", "emulator", "--formats", "e2m1", "--ops", "cast",
                     "dequantize", "--report", str(report)])
    assert code == 0
    data = json.loads(report.read_text())
    assert data["verdict"] == "pass" and data["header"]["backend"] == "emulator"
    assert {"suite", "python", "numpy", "device", "date", "command"} <= set(data["header"])
    assert report.with_suffix(".md").read_text().startswith("# Conformance: emulator")
    head = data["header"]
    assert head["spec"] == "OCP Microscaling Formats (MX) v1.0"
    assert head["suite"].startswith("ocpmx ") and head["commit"]  # short hash or 'unknown'
    assert data["verdict_text"] == "conformant"
    md = report.with_suffix(".md").read_text()
    assert "verdict: **conformant**" in md
    assert "| format | cast | quantize | dequantize | layout | gemm |" in md
    assert "| e2m1 | pass | - | pass | - | - |" in md
    bad = tmp_path / "bad.py"
    bad.write_text(textwrap.dedent("""
        import numpy as np
        from ocpmx.conformance.backends import EmulatorBackend
        class Swap(EmulatorBackend):
            name = "swap"
            def quantize_packed(self, x, fmt, axis=-1, **o):
                d, s = super().quantize_packed(x, fmt, axis=axis, **o)
                return ((d >> 4) | (d << 4)).astype(np.uint8), s
        class Ceil(EmulatorBackend):
            name = "ceil"
            def quantize(self, x, fmt, **o):
                return super().quantize(x, fmt, **dict(o, scale_rule="ceil"))
    """))
    assert cli.main(["conform", "--backend", f"{bad}:Swap", "--formats", "e2m1", "--ops",
                     "layout"]) == 1
    assert cli.main(["conform", "--backend", f"{bad}:Ceil", "--formats", "e2m1", "--ops",
                     "quantize", "--no-shrink", "--report", str(report)]) == 1
    data = json.loads(report.read_text())
    assert data["header"]["shrink"] is False
    assert any("not shrunk" in r["detail"] for r in data["checks"] if r["status"] == "fail")
    assert cli.main(["conform", "--backend", "nope"]) == 2


def test_entry_point_group(monkeypatch):
    """An outside package registers a backend in the entry-point group ocpmx.backends."""
    from ocpmx.conformance import backends

    class EntryPoint:
        name = "vendor_x"

        def load(self):
            return EmulatorBackend

    monkeypatch.setattr(backends, "entry_points",
                        lambda group: [EntryPoint()] if group == "ocpmx.backends" else [])
    assert isinstance(load_backend("vendor_x"), EmulatorBackend)


def test_torchao_peer_as_documented():
    """torchao 0.18's to_mx: bit-exact on ordinary blocks; fails on blocks of tiny values (its
    FLOOR path stores one scale and divides by another below amax ~ 2^-124)."""
    res = {r.check: r for r in run_suite(load_backend("torchao"), ["e2m1"], ops=["quantize"])}
    assert res["quantize/midpoints/e2m1/floor/rne"].status == "pass"
    assert res["quantize/saturation/e2m1/floor/rne"].status == "pass"
    tiny = res["quantize/all-bf16/e2m1/floor"]
    assert tiny.status == "fail" and "e-38" in tiny.failures[0]
    assert res["quantize/random/e2m1/stochastic/12345"].status == "not-supported"


def test_gfloat_peer_as_documented():
    """gfloat 0.5.2: raises on NaN for formats without NaN (error), gives an Inf block the
    scale 0xFE instead of NaN (fail), and is bit-exact on finite blocks."""
    res = {r.check: r for r in run_suite(load_backend("gfloat"), ["e2m1"], ops=["cast", "quantize"])}
    assert res["cast/all-bf16/e2m1"].status == "error" and "No NaN" in res["cast/all-bf16/e2m1"].detail
    spec = res["quantize/specials/e2m1/floor/rne"]
    assert spec.status == "fail" and any("scale got 0xfe, expected 0xff" in f for f in spec.failures)
    assert res["quantize/midpoints/e2m1/floor/rne"].status == "pass"


def test_conform_device_cpu_switches_on_the_interpreter():
    """`ocpmx conform --backend triton --device cpu` in a fresh process without TRITON_INTERPRET:
    nothing may import Triton before the CLI switches the interpreter on."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "ocpmx.cli", "conform", "--backend", "triton",
                           "--device", "cpu", "--ops", "dequantize", "--formats", "e2m1"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "verdict: conformant (" in done.stdout  # the verdict 'pass', in words


def test_verdict_words_and_summary_matrix():
    """The summary cell is the worst status of its slice; the verdict in words keeps the JSON's
    machine-readable value."""
    rs = [CheckResult("cast/a/e2m1", "cast", "e2m1", "pass"),
          CheckResult("cast/b/e2m1", "cast", "e2m1", "deviation"),
          CheckResult("gemm/a/e2m1", "gemm", "e2m1", "not-supported"),
          CheckResult("gemm/b/e2m1", "gemm", "e2m1", "pass"),
          CheckResult("quantize/a/e4m3", "quantize", "e4m3", "fail"),
          CheckResult("quantize/b/e4m3", "quantize", "e4m3", "error")]
    m = summary_matrix(rs, ["e2m1", "e4m3", "e5m2"]).splitlines()
    assert m[2] == "| e2m1 | deviation | - | - | - | not-supported |"
    assert m[3] == "| e4m3 | - | error | - | - | - |"
    assert m[4] == "| e5m2 | - | - | - | - | - |"
    words = {"pass": "conformant", "deviation": "conformant with documented deviations",
             "fail": "not conformant", "error": "not conformant"}
    for status, text in words.items():
        j = to_json([CheckResult("c", "cast", "e2m1", status)], {})
        assert (j["verdict"], j["verdict_text"]) == (status, text)


def test_probe_details_are_text():
    p = {"e8m0_0x00": "0", "e8m0_0xff": "NaN",
         "scale_applied": "to bf16 operands (2^-136 became 0.0)", "alignment_bits": 25, "alignment_rounding": "truncate", "products_per_step": 16}
    assert describe_probe(p) == ("alignment bits 25, truncate, 16 products per step; E8M0 0x00 = 0 "
                                 "(spec: 2^-127), 0xFF = NaN; scale applied to bf16 operands "
                                 "(2^-136 became 0.0)")
    res = {r.check: r for r in run_suite(EmulatorBackend(), ["e4m3"], ops=["gemm"])}
    acc = res["gemm/probe/accumulation"]
    assert "{" not in acc.detail and "alignment bits" in acc.detail
    assert acc.data["alignment_bits"] >= 34  # the structured findings stay in the JSON


NAN_TO_ZERO = """
    import numpy as np
    from ocpmx.conformance.backends import EmulatorBackend
    class NanToZero(EmulatorBackend):
        name = "nan_to_zero"
        def cast(self, x, fmt):
            codes = super().cast(x, fmt)
            return np.where(np.isnan(x), 0, codes).astype(np.uint8) if fmt == "e4m3" else codes
"""


def test_report_path_checked_before_the_run(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    args = ["conform", "--backend", "emulator", "--formats", "e2m1", "--ops", "cast"]
    for bad in (blocker / "r.json", tmp_path / "r.md", tmp_path):
        capsys.readouterr()
        assert cli.main(args + ["--report", str(bad)]) == 2
        out = capsys.readouterr()
        assert out.out == "" and len(out.err.strip().splitlines()) == 1, out  # nothing ran
        assert out.err.startswith("ocpmx conform: error: --report")


def test_user_deviations_file(tmp_path, capsys):
    """--deviations FILE adds known deviations to the built-in ones: the fail becomes a
    documented deviation (exit 0, 4 with --strict); a malformed file or one for another
    backend is refused with one line, exit 2."""
    backend = tmp_path / "nz.py"
    backend.write_text(textwrap.dedent(NAN_TO_ZERO))
    args = ["conform", "--backend", f"{backend}:NanToZero", "--formats", "e4m3", "--ops", "cast"]
    assert cli.main(args) == 1
    dev = {"backend": "nan_to_zero", "source": "our chip's manual, section 3",
           "deviations": [{"id": "e4m3-nan-to-zero", "op": "cast", "formats": ["e4m3"],
                           "input": ["nan"], "got": ["zero"],
                           "description": "NaN converts to +0"}]}
    f = tmp_path / "dev.json"
    f.write_text(json.dumps(dev))
    report = tmp_path / "out" / "r.json"
    assert cli.main(args + ["--deviations", str(f), "--report", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["verdict"] == "deviation"
    assert data["verdict_text"] == "conformant with documented deviations"
    assert str(f) in data["header"]["deviations"]
    by = {c["check"]: c for c in data["checks"]}
    assert by["cast/all-bf16/e4m3"]["deviations"] == ["e4m3-nan-to-zero"]
    assert cli.main(args + ["--deviations", str(f), "--strict"]) == 4
    for broken in ({"deviations": [{"id": "x", "op": "cast"}]},
                   {**dev, "backend": "triton"}, "not json"):
        f.write_text(broken if isinstance(broken, str) else json.dumps(broken))
        capsys.readouterr()
        assert cli.main(args + ["--deviations", str(f)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and str(f) in err


def _doc_block(marker: str, lang: str) -> str:
    """The code block that follows ``marker`` in docs/conformance-on-new-hardware.md."""
    text = (Path(__file__).parent.parent / "docs" / "conformance-on-new-hardware.md").read_text()
    return text.split(marker, 1)[1].split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def test_runbook_gfx950_model_with_its_deviations_file(tmp_path):
    """The runbook's gfx950 model backend and its deviations file, as printed there: without
    the file the gfx950 conversions fail the OCP checks; with it every difference is a named
    deviation, and nothing else differs."""
    backend = tmp_path / "gfx950_model.py"
    backend.write_text(_doc_block("<!-- gfx950-model-backend -->", "python"))
    dev = tmp_path / "gfx950.json"
    dev.write_text(_doc_block("<!-- gfx950-deviations -->", "json"))
    args = ["conform", "--backend", f"{backend}:Gfx950Model", "--formats", "e2m1", "e4m3", "e5m2"]
    assert cli.main(args + ["--ops", "cast"]) == 1
    report = tmp_path / "r.json"
    assert cli.main(args + ["--ops", "cast", "quantize", "dequantize", "--deviations", str(dev),
                            "--report", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["verdict"] == "deviation"
    st = {c["check"]: c["status"] for c in data["checks"]}
    assert "fail" not in st.values() and "error" not in st.values()
    assert st["quantize/random/e2m1/stochastic/12345"] == "not-supported"
    assert st["dequantize/every-code-every-scale/e4m3"] == "pass"
    found = {d for c in data["checks"] for d in c["deviations"]}
    assert found == {"gfx950-fp4-fp6-nan-to-max", "gfx950-e5m2-nan-code",
                     "gfx950-e4m3-overflow-nan", "gfx950-e5m2-overflow-inf",
                     "gfx950-nan-scale-block-codes"}


def test_triton_gfx950_backend(tmp_path):
    """The built-in backend of quantize(..., conversion='gfx950'): gfx950's instructions on a
    gfx950 GPU; here AMD's model in the Triton kernel's software conversion (the
    interpreter). Every difference from OCP is a
    deviation of its built-in file (with the Triton backend's, whose GEMM and dequantize it
    runs), the packed layout passes (the layout check packs the backend's own codes), and the
    built-in rules are the runbook's."""
    report = tmp_path / "g.json"
    args = ["conform", "--backend", "triton_gfx950", "--device", "cpu", "--formats", "e2m1",
            "e4m3", "e5m2", "e3m2", "--ops", "quantize", "layout", "dequantize", "--report",
            str(report)]
    assert cli.main(args) == 0
    data = json.loads(report.read_text())
    assert data["verdict"] == "deviation"
    assert data["header"]["deviations"] == ("built-in deviations/triton.json + built-in "
                                            "deviations/triton_gfx950.json")
    assert "gfx950 model in software" in data["header"]["conversion"]  # the kernel, not the
    # emulator: --device cpu runs the Triton interpreter
    st = {c["check"]: c["status"] for c in data["checks"]}
    assert "fail" not in st.values() and "error" not in st.values()
    assert all(st[f"layout/packed/{f}"] == "pass" for f in ("e2m1", "e4m3", "e5m2", "e3m2"))
    assert st["quantize/random/e2m1/stochastic/12345"] == "not-supported"
    found = {d for c in data["checks"] for d in c["deviations"]}
    assert {"gfx950-e4m3-overflow-nan", "gfx950-e5m2-overflow-inf",
            "gfx950-nan-scale-block-codes"} <= found
    builtin = json.loads((Path(__file__).parent.parent / "conformance" / "deviations" /
                          "triton_gfx950.json")
                         .read_text())
    doc = json.loads(_doc_block("<!-- gfx950-deviations -->", "json"))
    assert builtin["deviations"] == doc["deviations"]


class _Folding(EmulatorBackend):
    """An emulator backend whose GEMM is a folded FP8 GEMM (``FoldedModel``) and takes FP4/FP6
    formats only, as ``native.mx_matmul(method="fp8")`` does."""

    def __init__(self, model):
        self.model = model

    def supports(self, op, fmt, **options):
        if op == "gemm" and fmt not in ("e2m1", "e2m3", "e3m2"):
            return "folds FP4/FP6 only"
        return True

    def gemm(self, a_codes, a_scales, b_codes, b_scales, fmt_a, fmt_b):
        a = emulator.MXArray(a_codes, a_scales, get_format(fmt_a), 1)
        b = emulator.MXArray(b_codes, b_scales, get_format(fmt_b), 1)
        return emulator.mx_matmul(a, b, self.model)


@pytest.mark.parametrize("group, chained, dot, chain", [
    (4, False, "hopper", None), (32, True, "hopper", None), (8, False, "exact", None),
    (1, False, "hopper", None), (64, True, "hopper", None), (4, True, "hopper", 2),
    (None, True, "hopper", 4)])  # the last: cuBLAS's rowwise model (whole rows, spans of 4)
def test_fold_probe_infers_the_folded_model_unaided(group, chained, dot, chain):
    """``probe_folding`` finds a folding backend's group, chaining (and the span of blocks one
    chain covers) and dot rule from designed dot products alone, and the suite's check
    reproduces the backend with the inferred model; the exact emulator shows no fold. A whole
    row is 64 blocks at the probe's K = 2048."""
    from ocpmx.conformance.suite import model_from_fold_probe, probe_folding
    from ocpmx.emulator.fold import FoldedModel
    backend = _Folding(FoldedModel(group, chained, dot, chain))
    p = probe_folding(backend)
    seen = group or 64
    assert (p["group"], p["chained"] is True, p["dot"], p.get("chain")) == \
        (seen, chained, dot, chain), p
    assert model_from_fold_probe(p) == FoldedModel(seen, chained, dot, chain)
    results = {r.check: r for r in run_suite(backend, formats=("e2m1",), ops=("gemm",))}
    assert results["gemm/probe/fold"].status == "pass"
    assert results["gemm/fold-model-reproduces-backend"].status == "pass", \
        results["gemm/fold-model-reproduces-backend"].detail
    exact = probe_folding(EmulatorBackend())
    assert exact == {"group": 1, "chained": "not observable (group 1)", "dot": "exact"}
    assert model_from_fold_probe(exact) is None


def test_fold_probe_check_fails_a_backend_its_model_does_not_reproduce():
    """A backend that folds in groups of 4 but chains only every other group's dots (no
    FoldedModel): the probe infers a model, and the reproduction check fails."""
    from ocpmx.emulator.fold import FoldedModel

    class Mixed(_Folding):
        def gemm(self, a_codes, a_scales, b_codes, b_scales, fmt_a, fmt_b):
            a = emulator.MXArray(a_codes, a_scales, get_format(fmt_a), 1)
            b = emulator.MXArray(b_codes, b_scales, get_format(fmt_b), 1)
            out = emulator.mx_matmul(a, b, FoldedModel(4, False))
            odd = emulator.mx_matmul(a, b, FoldedModel(4, True))
            out[1::2] = odd[1::2]
            return out
    results = {r.check: r for r in run_suite(Mixed(None), formats=("e2m1",), ops=("gemm",))}
    assert results["gemm/probe/fold"].status == "pass"
    check = results["gemm/fold-model-reproduces-backend"]
    assert check.status == "fail"
    # the report scores the candidate models: each half of the outputs is one model's
    close = check.data["closeness"]
    for m in (FoldedModel(4, False), FoldedModel(4, True)):
        assert 0 < close[str(m)]["differ"] < close[str(m)]["outputs"]
    assert close["exact"]["differ"] > 0 and "closest model" in check.detail


def test_ulp_distance():
    from ocpmx.conformance.suite import ulp_distance
    one = np.float32(1)
    got = np.array([one, -0.0, -one, np.nan, one, np.inf], np.float32)
    want = np.array([np.nextafter(one, np.float32(2)), 0.0, np.nextafter(-one, np.float32(0)),
                     np.nan, np.nan, np.finfo(np.float32).max], np.float32)
    assert ulp_distance(got, want).tolist() == [1, 1, 1, 0, 2**32, 1]


def test_fp8_cublas_backend_pads_to_cublas_shapes():
    """The cuBLAS fold backend refuses GEMMs off CUDA with the reason, and pads M, N to 16 and K
    to 128 with zero blocks: through the interpreter (its method swapped for fp8_exact, as
    cuBLAS is CUDA only) exactly summable 5 x 96 and 7 x 96 operands give the exact product."""
    pytest.importorskip("torch")
    from ocpmx.conformance.backends import TritonFp8CublasBackend
    from ocpmx.conformance.strategies import exactly_summable_operand
    from ocpmx.native import interpreting
    if not interpreting():
        pytest.skip("the Triton backend on CPU needs the interpreter")
    backend = load_backend("triton_fp8_cublas", device="cpu")
    assert isinstance(backend, TritonFp8CublasBackend)
    assert "CUDA" in backend.supports("gemm", "e2m1")
    backend.gemm_method = "fp8_exact"
    rng = np.random.default_rng(3)
    (ac, as_), (bc, bs) = (exactly_summable_operand(rng, r, 96, "e2m1") for r in (5, 7))
    got = backend.gemm(ac, as_, bc, bs, "e2m1", "e2m1")
    want = emulator.mx_matmul(emulator.MXArray(ac, as_, get_format("e2m1"), 1),
                              emulator.MXArray(bc, bs, get_format("e2m1"), 1), "exact")
    assert got.shape == (5, 7)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("name, model", [("triton_fp8_exact", (4, False, "exact")),
                                         ("triton_fp8", (32, False, "exact"))])
def test_fold_probe_on_the_triton_fold_backends(name, model):
    """The Triton fold backends through the interpreter (exact dots there): the probe infers
    their groups (4 and 32), the chain being unobservable with exact dots, and the model
    reproduces them; E4M3 GEMMs are refused with the reason."""
    pytest.importorskip("torch")
    from ocpmx.conformance.suite import model_from_fold_probe, probe_folding
    from ocpmx.emulator.fold import FoldedModel
    from ocpmx.native import interpreting
    if not interpreting():
        pytest.skip("the Triton backend on CPU needs the interpreter")
    backend = load_backend(name, device="cpu")
    assert "folds" in backend.supports("gemm", "e4m3")
    assert model_from_fold_probe(probe_folding(backend)) == FoldedModel(*model)


def test_suite_commit_names_the_tree(monkeypatch):
    """The report's commit: OCPMX_COMMIT where set (a tree copied without its history), else
    git's HEAD, marked -dirty where tracked files differ from it."""
    import subprocess

    from ocpmx.conformance.suite import suite_commit
    monkeypatch.setenv("OCPMX_COMMIT", "abc1234")
    assert suite_commit() == "abc1234"
    monkeypatch.delenv("OCPMX_COMMIT")
    got = suite_commit()
    root = Path(__file__).resolve().parent.parent
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                          capture_output=True, text=True)
    if head.returncode != 0:
        assert got == "unknown"
    else:
        assert got.split("-")[0] == head.stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root).returncode == 1
        assert got.endswith("-dirty") == dirty

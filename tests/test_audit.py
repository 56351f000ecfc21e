"""The compile audit (``ocpmx audit``, ``ocpmx.audit``): the CI subset for gfx950 passes, and
planted regressions fail it. CPU only: Triton 3.9 compiles for gfx950 and sm_100a without the
chips (its wheel ships the AMD code generator and device libraries, and ptxas / cuobjdump of
CUDA 12.9, which know sm_100a)."""
from __future__ import annotations

import pytest
import torch
import triton

from ocpmx.audit import ARCHS, run_audit
from ocpmx.audit.report import check_writable, markdown
from ocpmx.native import gemm, kernels, launch

GFX950_LDS = 160 * 1024


def _failures(report: dict) -> list[str]:
    return report["workload"]["errors"] + [
        f"#{v['id']} {v['kernel']} {v['constexprs']}: {v['failures']}"
        for v in report["variants"] if v["status"] in ("fail", "error")]


@pytest.fixture(scope="module")
def subset_gfx950():
    return run_audit("gfx950", subset=True)


def test_subset_gfx950_passes(subset_gfx950):
    r = subset_gfx950
    assert r["verdict"] == "pass" and r["exit_code"] == 0, _failures(r)
    # recorded at the launch sites: every kernel family the subset's calls reach
    assert {v["kernel"] for v in r["variants"]} >= {
        "quantize_rows32_kernel", "quantize_kernel", "dequantize_kernel", "mx_gemm_kernel"}
    gemms = [v for v in r["variants"] if v["kernel"] == "mx_gemm_kernel" and v["reachable"]]
    assert len(gemms) == 9  # e2m1 x e2m1: 5 configs; e4m3 x e4m3: 4 (one pruned)
    for v in gemms:
        assert v["mx_instruction"] == ["v_mfma_scale_f32_32x32x64_f8f6f4"]
        fmt = v["constexprs"].split()[0]
        code = {"e2m1": 4, "e4m3": 0}[fmt]
        assert v["operand_formats"]["found"] == [[code, code]]
        assert v["shared_bytes"] <= GFX950_LDS and not v["spills"]
    # conversion='gfx950': the kernel of gfx950's own conversion instructions, each variant
    # holding the instruction it names
    hw = sorted(v["conversions"] for v in r["variants"]
                if v["kernel"] == "quantize_gfx950_kernel")
    assert hw == [["v_cvt_scalef32_pk_fp4_f32"], ["v_cvt_scalef32_sr_fp8_f32"]]
    # the autotuner's own prune drops the FP8 128x128x256 3-stage tile on gfx950
    pruned = r["summary"]["pruned_configs"]
    assert [(p["constexprs"].split()[0], p["config"]) for p in pruned] == [
        ("e4m3", "128x128x256 w8 s3")]
    assert "**Verdict: PASS**" in markdown(r)


def test_prune_per_device():
    configs = gemm._configs()
    big = [c for c in configs if c.kwargs["BLOCK_K"] == 256 and c.num_stages == 3]
    for fmt in ("e4m3", "e5m2"):
        kept = gemm.fitting_configs(configs, fmt, fmt, GFX950_LDS)
        assert [c for c in configs if c not in kept] == big
        assert gemm.smem_estimate(big[0], fmt, fmt) >= 205792  # what gfx950 allocates
    assert gemm.fitting_configs(configs, "e2m1", "e4m3", GFX950_LDS) == configs
    assert gemm.fitting_configs(configs, "e4m3", "e4m3", ARCHS["sm_100a"].lds_limit) == configs
    # on the CPU / the interpreter nothing is pruned
    assert gemm._smem_limit(torch.empty(1)) is None
    assert gemm.fitting_configs(configs, "e4m3", "e4m3", None) == configs


def _operands(fmt_a, fmt_b, m=128, n=128, k=512):
    """CPU tensors shaped as ``mx_matmul_kmajor`` passes them (nothing is launched)."""
    pa, pb = (2 if f == "e2m1" else 1 for f in (fmt_a, fmt_b))
    u8 = torch.uint8
    return (torch.empty(m, k // pa, dtype=u8), torch.empty(n, k // pb, dtype=u8),
            torch.empty(m, k // 32, dtype=u8), torch.empty(n, k // 32, dtype=u8),
            torch.empty(m, n), m, n, k)


def _meta(fmt_a, fmt_b):
    return dict(FMT_A=fmt_a, FMT_B=fmt_b, PACK_A=2 if fmt_a == "e2m1" else 1,
                PACK_B=2 if fmt_b == "e2m1" else 1, BS=32, OUT_BF16=False)


def test_planted_one_warp_gemm_fails():
    """A GEMM launched on one warp: gfx950's dot_scaled falls back to the bf16 decomposition."""
    def plant():
        launch.run(kernels.gemm.mx_gemm_kernel, (1,), *_operands("e2m1", "e2m1"),
                   **_meta("e2m1", "e2m1"), BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, GROUP_M=4,
                   num_warps=1)

    r = run_audit("gfx950", workload=[], extra=plant)
    assert r["verdict"] == "fail" and r["exit_code"] == 1
    [v] = r["variants"]
    assert v["origin"] == "planted" and v["options"] == {"num_warps": 1}
    assert any(f.startswith("no MX matrix instruction") for f in v["failures"]), v["failures"]
    assert any("v_cvt_scalef32_pk_bf16_fp4" in f and "v_mfma_f32_32x32x16_bf16" in f
               for f in v["failures"] if f.startswith("bf16 decomposition")), v["failures"]


def test_planted_oversize_config_fails():
    """An autotuner without the prune: the FP8 128x128x256 3-stage config reaches a launch."""
    unpruned = triton.autotune([c for c in gemm._configs() if c.kwargs["BLOCK_K"] == 256],
                               key=["M", "N", "K"])(kernels.gemm.mx_gemm_kernel)

    def plant():
        launch.run(unpruned, (1,), *_operands("e4m3", "e4m3"), **_meta("e4m3", "e4m3"))

    r = run_audit("gfx950", workload=[], extra=plant)
    assert r["verdict"] == "fail"
    [v] = r["variants"]
    assert v["reachable"] and v["config"] == "128x128x256 w8 s3"
    assert v["shared_bytes"] > GFX950_LDS
    assert f"shared memory {v['shared_bytes']} B over the limit {GFX950_LDS} B" in v["failures"]
    # the bf16 decomposition is not the problem here: the MX instruction is there
    assert v["mx_instruction"] == ["v_mfma_scale_f32_32x32x64_f8f6f4"]


def test_gfx950_hardware_conversions_compile_and_are_checked(monkeypatch):
    """Every format and rounding of quantize(..., conversion='gfx950') compiles for gfx950 with
    its instruction (the SR FP4 source a register pair); on another chip the same kernel
    cannot assemble, and an OCP quantize kernel holding such an instruction fails the check."""
    from ocpmx.audit import check, record
    calls = record._gfx950_calls(("e2m1", "e4m3", "e5m2"), ("rne", "stochastic"),
                                 (torch.float32,))[::2]
    r = run_audit("gfx950", workload=calls)
    assert r["verdict"] == "pass", _failures(r)
    assert sorted(v["conversions"] for v in r["variants"]) == sorted(
        [i] for i in kernels.gfx950.INSTRUCTIONS.values())
    fake = {"text": "v_cvt_scalef32_pk_fp4_f32 v0, v1, v2, v3", "spills": 0}
    launch_ = record.Launch("ocpmx.native.kernels.quantize:quantize_rows32_kernel", (), (), ())

    class Meta:
        shared, num_warps, num_stages = 0, 4, 1

    class Kernel:
        metadata = Meta()
    monkeypatch.setattr(check, "_amd_facts", lambda kernel: dict(fake))
    out = check.analyze(ARCHS["gfx950"], launch_, Kernel())
    assert out["status"] == "fail" and "hardware conversion instructions" in out["failures"][0]


def test_gfx950_software_conversion_compiles_elsewhere():
    """conversion='gfx950' off gfx950 (the kernel's software conversion, ``HW=False``) compiles
    for sm_100a and passes as an integer-arithmetic conversion kernel: no conversion
    instruction, no spill."""
    from ocpmx.audit import record
    calls = record._gfx950_calls(("e2m1", "e3m2"), ("rne", "stochastic"), (torch.bfloat16,),
                                 hardware=False)
    r = run_audit("sm_100a", workload=calls)
    assert r["verdict"] == "pass", _failures(r)
    soft = [v for v in r["variants"] if v["kernel"] == "quantize_gfx950_kernel"]
    assert len(soft) == 4 and all("SMB=7" in v["constexprs"] and v["conversions"] == []
                                  and not v["spills"] for v in soft), soft


def test_sm_100a_compiles():
    """Triton 3.9 emits sm_100a code here (ptxas 12.9 in the wheel): a tcgen05 block-scaled
    MMA of the right kind, no HMMA fallback. Were it unable to, the audit would report the
    chip 'not-supported' with the compiler's reason instead."""
    def plant():
        for fa, fb in (("e2m1", "e2m1"), ("e5m2", "e2m1")):
            launch.run(kernels.gemm.mx_gemm_kernel, (1,), *_operands(fa, fb), **_meta(fa, fb),
                       BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, GROUP_M=8, num_warps=4)

    r = run_audit("sm_100a", workload=[], extra=plant)
    assert r["verdict"] == "pass", _failures(r)
    kinds = [(v["mx_instruction"], v["operand_formats"]["found"], v["ptx_target"])
             for v in r["variants"]]
    assert kinds == [(["tcgen05.mma kind::mxf4"], [[1, 1]], "sm_100a"),
                     (["tcgen05.mma kind::mxf8f6f4"], [[1, 5]], "sm_100a")]


def test_unsupported_chip_is_reported(monkeypatch):
    """A chip the installed Triton cannot compile for is reported 'not-supported' with the
    compiler's reason (exit code 1), not passed silently."""
    from dataclasses import replace

    from ocpmx.audit import check
    monkeypatch.setitem(check.ARCHS, "sm_200a", replace(ARCHS["sm_100a"], name="sm_200a", arch=200))
    r = run_audit("sm_200a", workload=[])
    assert r["verdict"] == "not-supported" and r["exit_code"] == 1
    assert r["reason"].startswith(f"Triton {triton.__version__} cannot compile for sm_200a: ")
    assert "Not supported: Triton" in markdown(r)


def test_cli_usage_errors(tmp_path, capsys):
    from ocpmx.cli import main
    assert main(["audit", "--arch", "gfx950", "--report", str(tmp_path / "no" / "r.json")]) == 2
    assert "not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["audit", "--arch", "gfx942"])
    assert e.value.code == 2
    assert check_writable(str(tmp_path / "r.json")) is None


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gfx950", "sm_100a"])
def test_full_audit(arch):
    """The full audit (~600 variants: 4-20 min with 2 processes here from a cold Triton cache,
    far less warm). Both chips pass since the sm_100 strided tile (results/audit/README.md)."""
    r = run_audit(arch, jobs=2)
    assert r["verdict"] == "pass", _failures(r)


def test_sm_100a_prunes_spilling_tiles():
    """On sm_100 the autotuner drops the tiles Triton 3.9 spills there (measured by the full
    audit, which compiles the pruned configs too): fp32 outputs of 128 accumulators per thread
    when M or N is ragged, FP4 x FP8 with BLOCK_K 256 to bf16. Elsewhere nothing is dropped."""
    from ocpmx.audit.record import _matmul_calls, record

    def reachable(arch, mnk, pair, out_dtype):
        launches, errors = record(ARCHS[arch], _matmul_calls([pair], [out_dtype], mnk=mnk))
        assert not errors
        return {x.config: x.reachable for x in launches if x.config}  # the autotuned GEMM

    ragged = reachable("sm_100a", (100, 120, 256), ("e2m1", "e2m1"), torch.float32)
    assert ragged == {"128x128x128 w8 s3": True, "128x256x128 w8 s3": False,
                      "256x128x128 w8 s3": False, "128x128x256 w8 s3": True,
                      "128x128x128 w4 s4": False}
    assert all(reachable("sm_100a", (128, 128, 256), ("e2m1", "e2m1"), torch.float32).values())
    assert all(reachable("gfx950", (100, 120, 256), ("e2m1", "e2m1"), torch.float32).values())
    mixed = reachable("sm_100a", (128, 128, 512), ("e2m1", "e4m3"), torch.bfloat16)
    assert [c for c, kept in mixed.items() if not kept] == ["128x128x256 w8 s3"]
    assert all(reachable("sm_100a", (128, 128, 512), ("e4m3", "e2m1"), torch.bfloat16).values())

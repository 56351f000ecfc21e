"""CPU benchmark (not a test): quantize 2^24 float32 values to MXFP4.

Run:  pytest benchmarks/test_bench_quantize.py --benchmark-only --benchmark-json results/bench_quantize_cpu.json
Baseline in the same run: an ml_dtypes pipeline (numpy block amax, exact floor scale via
frexp, divide, ``astype(float4_e2m1fn)``), the fastest peer measured on this machine.
"""
import ml_dtypes
import numpy as np
import pytest

from ocpmx.emulator import quantize

N = 1 << 24


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(0).standard_normal((N // 4096, 4096)).astype(np.float32)


def ml_dtypes_pipeline(x):
    blocks = x.reshape(-1, 32)
    amax = np.max(np.abs(blocks), axis=1, keepdims=True)
    _, e = np.frexp(amax)
    s = np.clip(e - 1 - 2, -127, 127)  # floor(log2 amax) - emax(e2m1)
    codes = (blocks / np.ldexp(np.float32(1), s)).astype(ml_dtypes.float4_e2m1fn).view(np.uint8)
    return codes.reshape(x.shape), (s + 127).astype(np.uint8)


def test_pipelines_agree(x):
    ours = quantize(x[:64], "e2m1")
    codes, scales = ml_dtypes_pipeline(x[:64])
    assert np.array_equal(ours.codes, codes) and np.array_equal(ours.scales.ravel(), scales.ravel())


@pytest.mark.benchmark(group="quantize-2^24-f32-to-mxfp4")
def test_ocpmx_emulator(benchmark, x):
    quantize(x[:1], "e2m1")  # compile outside the timing
    benchmark.extra_info["melem_per_s"] = None
    benchmark.pedantic(quantize, args=(x, "e2m1"), rounds=10, iterations=1, warmup_rounds=1)
    benchmark.extra_info["melem_per_s"] = N / benchmark.stats.stats.median / 1e6


@pytest.mark.benchmark(group="quantize-2^24-f32-to-mxfp4")
def test_ml_dtypes_pipeline(benchmark, x):
    benchmark.pedantic(ml_dtypes_pipeline, args=(x,), rounds=5, iterations=1, warmup_rounds=1)
    benchmark.extra_info["melem_per_s"] = N / benchmark.stats.stats.median / 1e6

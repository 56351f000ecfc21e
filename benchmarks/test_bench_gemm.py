"""CPU benchmark (not a test): ``emulator.mx_matmul`` at 256 x 1024 x 4096 (M x N x K).

Run:  pytest benchmarks/test_bench_gemm.py --benchmark-only -p no:cacheprovider -o addopts="" \
          --benchmark-json results/bench_gemm_cpu.json

The fast path (``path="fast"``, what ``mx_matmul`` runs by default) and the per-element
reference kernel (``path="reference"``) for the models exact, fp32_sequential, hopper_bf16 and
hopper_fp8, on E2M1 x E2M1 and E4M3 x E4M3 operands quantized from normal data. Baseline in
the same run: NumPy float32 matmul of the same shape (FLOP = 2*M*N*K throughout). The
reference takes 10-40 s a call, so it runs once per case.
"""
import numpy as np
import pytest

from ocpmx.emulator import MXArray, mx_matmul, quantize

M, N, K = 256, 1024, 4096
FLOP = 2 * M * N * K
FORMATS = ["e2m1", "e4m3"]
MODELS = ["exact", "fp32_sequential", "hopper_bf16", "hopper_fp8"]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((M, K)).astype(np.float32), rng.standard_normal((N, K)).astype(np.float32)


@pytest.fixture(scope="module")
def operands(data):
    x, w = data
    return {f: (quantize(x, f), quantize(w, f)) for f in FORMATS}


def _head(mx: MXArray, rows: int, k: int) -> MXArray:
    return MXArray(mx.codes[:rows, :k].copy(), mx.scales[:rows, :k // 32].copy(), mx.fmt, 1)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("model", MODELS)
def test_paths_agree(operands, fmt, model):
    a, b = (_head(x, 16, 1024) for x in operands[fmt])
    fast = mx_matmul(a, b, model, path="fast")
    assert np.array_equal(fast.view(np.uint32), mx_matmul(a, b, model, path="reference").view(np.uint32))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("path", ["fast", "reference"])
def test_mx_matmul(benchmark, operands, fmt, model, path):
    a, b = operands[fmt]
    benchmark.group = f"mx_matmul-{M}x{N}x{K}-{fmt}"
    mx_matmul(_head(a, 4, 64), _head(b, 4, 64), model, path=path)   # compile outside the timing
    rounds = 5 if path == "fast" else 1
    benchmark.pedantic(mx_matmul, args=(a, b, model), kwargs={"path": path}, rounds=rounds,
                       iterations=1, warmup_rounds=1 if path == "fast" else 0)
    benchmark.extra_info["gflop_per_s"] = FLOP / benchmark.stats.stats.median / 1e9


def test_numpy_float32_matmul(benchmark, data):
    x, w = data
    benchmark.group = f"numpy-float32-{M}x{N}x{K}"
    benchmark.pedantic(np.matmul, args=(x, w.T), rounds=20, iterations=1, warmup_rounds=2)
    benchmark.extra_info["gflop_per_s"] = FLOP / benchmark.stats.stats.median / 1e9

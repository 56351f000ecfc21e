"""llama_train: model sizes, the C4-layout data path, exact resume, NaN policy, bad configs."""
import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from ocpmx import cli
from ocpmx.llama_train import profiling as P
from ocpmx.llama_train import train as T
from ocpmx.llama_train.data import (TokenStream, load_tokenizer, tokenize_split, train_tokenizer,
                                    validation_set)
from ocpmx.llama_train.model import PRESETS, Llama, get_config, rope_frequencies
from ocpmx.native import MXLinear


def cfg(corpus, out, **kw):
    base = dict(preset="tiny", recipe="mxfp4_all_sr_wgrad", out=str(out), data=str(corpus),
                max_steps=8, batch_size=2, seq_len=32, warmup_steps=2, eval_every=4,
                eval_sequences=4, save_every=4, progress=False, backend="emulator")
    base.update(kw)
    return T.TrainConfig.from_flat(**base)


def test_8b_is_llama_3_1_8b():
    c = PRESETS["8b"]
    assert (c.n_layers, c.dim, c.ffn_dim, c.n_heads, c.n_kv_heads, c.vocab_size, c.rope_theta) == \
        (32, 4096, 14336, 32, 8, 128256, 500000.0)
    assert 8.02e9 < c.n_params() < 8.04e9  # 8,030,261,248 with untied embeddings
    with torch.device("meta"):
        m = Llama(c)
    assert sum(p.numel() for p in m.parameters()) == c.n_params()


def test_rope_llama3_scaling():
    c = get_config("8b")
    f = rope_frequencies(c, 2).angle()[1].double()  # the angle at position 1 = the frequency
    base = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
    assert torch.allclose(f[0], base[0])                      # high frequency: unchanged
    assert torch.allclose(f[-1], base[-1] / 8, rtol=1e-6)     # low frequency: divided by 8


def test_stream_is_deterministic_and_resumable(corpus):
    tok = load_tokenizer(corpus / "tokenizer.json")
    a = TokenStream(corpus, tok, 32, seed=3)
    full = [a.next_batch(4) for _ in range(30)]  # crosses shard boundaries
    b = TokenStream(corpus, tok, 32, seed=3)
    for _ in range(11):
        b.next_batch(4)
    c = TokenStream(corpus, tok, 32, seed=3, state=json.loads(json.dumps(b.state())))
    for i in range(11, 30):
        assert torch.equal(c.next_batch(4), full[i])
    other = TokenStream(corpus, tok, 32, seed=4)
    assert not torch.equal(other.next_batch(4), full[0])
    eos = tok.token_to_id("<|endoftext|>")
    assert any((x == eos).any() for x in full)
    v1, v2 = validation_set(corpus, tok, 32, 4), validation_set(corpus, tok, 32, 4)
    assert torch.equal(v1, v2) and v1.shape == (4, 33)


def test_pretokenized_cache_gives_the_same_stream(corpus, tmp_path):
    import shutil
    d = tmp_path / "c"
    shutil.copytree(corpus, d)
    tok = load_tokenizer(d / "tokenizer.json")
    plain = TokenStream(d, tok, 64, seed=5)
    assert not plain.cached
    meta = tokenize_split(d, tok, "train")
    assert meta["tokens"] == meta["offsets"][-1] > 0
    cached = TokenStream(d, tok, 64, seed=5)
    assert cached.cached
    n_batches = 3 * meta["tokens"] // (4 * 65)  # three epochs: shard and epoch boundaries
    half = n_batches // 2
    seen = []
    for i in range(n_batches):
        a, b = plain.next_batch(4), cached.next_batch(4)
        assert torch.equal(a, b), f"batch {i}"
        seen.append(b)
        if i == half:
            saved = json.loads(json.dumps(cached.state()))
    assert cached.epoch >= 2
    resumed = TokenStream(d, tok, 64, seed=5, state=saved)
    for i in range(half + 1, n_batches):
        assert torch.equal(resumed.next_batch(4), seen[i]), f"resumed batch {i}"
    # a position saved in one mode cannot be used in the other
    with pytest.raises(ValueError, match="saved data position was taken with the cache"):
        TokenStream(d, tok, 64, seed=5, state=saved, use_cache=False)
    with pytest.raises(ValueError, match="taken with on-the-fly tokenization"):
        TokenStream(d, tok, 64, seed=5, state=plain.state())
    # a cache made with another tokenizer is ignored, not used
    other = train_tokenizer(d, tmp_path / "other.json", vocab_size=300)
    assert not TokenStream(d, other, 64, seed=5).cached
    # the validation set reads the validation cache the same way
    v = validation_set(d, tok, 32, 4)
    tokenize_split(d, tok, "validation")
    assert TokenStream(d, tok, 32, seed=0, split="validation", shuffle=False).cached
    assert torch.equal(validation_set(d, tok, 32, 4), v)


def test_tokenize_cache_is_the_same_for_any_number_of_workers(corpus, tmp_path, monkeypatch):
    """``tokenize_split`` with several shards at once (threads) writes the cache byte for byte as
    one shard after another does, and both equal each document encoded alone, in shard order,
    with the end-of-text id after each: shards keep their order whatever finishes first."""
    import shutil
    from ocpmx.llama_train.data import eos_id, iter_documents, shards
    d = tmp_path / "c"
    shutil.copytree(corpus, d)
    tok = load_tokenizer(d / "tokenizer.json")
    assert len(shards(d, "train")) >= 3
    want = np.concatenate([np.asarray(tok.encode(t).ids + [eos_id(tok)], dtype=np.uint16)
                           for p in shards(d, "train") for _, t in iter_documents(p)])
    import time
    from ocpmx.llama_train import data as D
    tokenize_shard = D._tokenize_shard

    def first_shard_last(path, *args):  # shards finish out of order
        if path == shards(d, "train")[0]:
            time.sleep(0.5)
        return tokenize_shard(path, *args)
    monkeypatch.setattr(D, "_tokenize_shard", first_shard_last)
    got = {}
    for workers, batch in ((1, 1024), (3, 7)):
        meta = tokenize_split(d, tok, "train", batch=batch, workers=workers)
        got[workers] = ((d / "c4-train.tokens.npy").read_bytes(), meta)
        assert np.array_equal(np.load(d / "c4-train.tokens.npy"), want)
    assert got[1] == got[3]


@pytest.mark.parametrize("fmt", ["full", "sharded"])
def test_resume_is_bit_exact(corpus, tmp_path, fmt):
    T.train(cfg(corpus, tmp_path / "full", checkpoint_format=fmt))
    T.train(cfg(corpus, tmp_path / "cut", max_steps=4, decay_steps=8, checkpoint_format=fmt))
    T.train(cfg(corpus, tmp_path / "cut", max_steps=8, checkpoint_format=fmt), resume=True)
    full, vf = T.read_metrics(tmp_path / "full" / "metrics.jsonl")
    cut, vc = T.read_metrics(tmp_path / "cut" / "metrics.jsonl")
    assert [r["step"] for r in cut] == list(range(8))
    assert [r["loss"] for r in cut] == [r["loss"] for r in full]
    assert [r["grad_norm"] for r in cut] == [r["grad_norm"] for r in full]
    assert [r["val_loss"] for r in vc] == [r["val_loss"] for r in vf]
    ck = tmp_path / "cut" / "checkpoints"
    assert (ck / "latest").read_text() == "step_00000007"
    assert sorted(p.name for p in ck.glob("step_*")) == ["step_00000003", "step_00000007"]
    assert not list(ck.glob(".tmp*"))
    names = ("model.safetensors", "optimizer.safetensors") if fmt == "full" else (".metadata",)
    for name in names + ("state.json",):
        assert (ck / "step_00000007" / name).is_file()
    assert json.loads((ck / "step_00000007" / "state.json").read_text())["format"] == fmt


def test_no_checkpoints_when_save_every_is_zero(corpus, tmp_path):
    T.train(cfg(corpus, tmp_path / "r", max_steps=2, save_every=0))
    assert not (tmp_path / "r" / "checkpoints").exists()
    assert len(T.read_metrics(tmp_path / "r" / "metrics.jsonl")[0]) == 2


def test_every_native_kernel_has_a_category():
    """Each Triton kernel of ``ocpmx.native.kernels`` lands in a named category of the step
    breakdown (the column kernel once sat in 'other'), found from the kernel modules, so a new
    kernel without one fails here."""
    import inspect
    import pkgutil
    from ocpmx.native import kernels as K
    names = set()
    for mod in pkgutil.iter_modules(K.__path__):
        m = __import__(f"ocpmx.native.kernels.{mod.name}", fromlist=["_"])
        names |= {n for n, _ in inspect.getmembers(m) if n.endswith("_kernel")}
    assert {"quantize_cols32_kernel", "quantize_rows32_kernel", "mx_gemm_kernel"} <= names
    want = {"dequantize_kernel": "dequantize", "transpose_kernel": "quantize",
            "fold_kernel": "quantize", "qdq_both_axes_kernel": "quantize",
            "columns_kernel": "quantize", "columns_fold_kernel": "quantize",
            "fold_rows_kernel": "quantize", "fold_rows_finish_kernel": "quantize"}
    for n in names:
        expected = want.get(n, "quantize" if n.startswith("quantize") else "gemm")
        assert P.kernel_category(n) == expected, n


def test_step_breakdown_categories(corpus, tmp_path):
    kernels = [("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 4000.0, 64),
               ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", 9000.0, 8),
               ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_TNT", 1000.0, 4),
               ("quantize_rows32_kernel", 600.0, 12), ("dequantize_kernel", 300.0, 12),
               ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", 2000.0, 2),
               ("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add>", 500.0, 30)]
    b = P.breakdown_from_kernels(kernels, steps=2)
    assert b["gpu_ms_per_step"] == {"gemm": 5.0, "communication": 2.0, "attention": 1.0,
                                    "quantize": 0.3, "other": 0.25, "dequantize": 0.15}
    assert b["top_kernels"][0]["category"] == "gemm" and b["top_kernels"][0]["calls_per_step"] == 4
    # on the CPU the profiler runs and finds no GPU kernels: an empty breakdown, no error
    T.train(cfg(corpus, tmp_path / "p", max_steps=3, profile_step=1))
    got = json.loads((tmp_path / "p" / "step_breakdown.json").read_text())
    assert got["steps"] == 2 and got["gpu_ms_per_step"] == {}
    # the host side: the CPU operations with the most self time, the model's matmuls among them
    names = [h["name"] for h in got["top_host_ops"]]
    assert got["host_ops_ms_per_step"] > 0 and any(n.startswith("aten::") for n in names), names
    assert all(h["self_ms_per_step"] >= g["self_ms_per_step"]
               for h, g in zip(got["top_host_ops"], got["top_host_ops"][1:]))
    # profiling the last step: the profiler is stopped at the end (left running, it crashed the
    # process at exit), the breakdown covers the one step
    T.train(cfg(corpus, tmp_path / "q", max_steps=3, profile_step=2))
    assert json.loads((tmp_path / "q" / "step_breakdown.json").read_text())["steps"] == 1


def test_nan_policy(corpus, tmp_path, monkeypatch):
    real = T.loss_fn
    calls = {"n": 0}

    def flaky(model, batch, device):
        loss = real(model, batch, device)
        if not model.training:  # evaluation
            return loss
        calls["n"] += 1
        return loss * float("nan") if calls["n"] == 6 else loss
    monkeypatch.setattr(T, "loss_fn", flaky)
    with pytest.raises(T.TrainingDiverged, match="step 5: non-finite loss.*last good checkpoint"):
        T.train(cfg(corpus, tmp_path / "stop"))
    assert (tmp_path / "stop" / "checkpoints" / "latest").read_text() == "step_00000003"
    calls["n"] = 0
    res = T.train(cfg(corpus, tmp_path / "skip", nan_policy="skip"))
    assert res["skipped"] == 1
    rows, _ = T.read_metrics(tmp_path / "skip" / "metrics.jsonl")
    assert rows[-1]["skipped"] == 1 and math.isnan(rows[5]["loss"])


def test_bad_configuration_fails_before_training(corpus, tmp_path):
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        T.train(cfg(corpus, tmp_path, preset="huge"))
    with pytest.raises(ValueError, match="unknown recipe 'mxfp5'"):
        T.train(cfg(corpus, tmp_path, recipe="mxfp5"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        T.train(cfg(corpus, tmp_path, data=str(tmp_path / "nowhere")))
    with pytest.raises(ValueError, match="not divisible by 32"):
        T.train(cfg(corpus, tmp_path, batch_size=3, seq_len=33))
    assert not (tmp_path / "metrics.jsonl").exists()


def test_lr_schedule():
    c = T.TrainConfig.from_flat(lr=1e-3, warmup_steps=10, max_steps=110, min_lr_ratio=0.1)
    assert T.lr_at(0, c) == pytest.approx(1e-4) and T.lr_at(9, c) == pytest.approx(1e-3)
    assert T.lr_at(60, c) == pytest.approx(0.55e-3) and T.lr_at(110, c) == pytest.approx(1e-4)


def test_config_sections_and_flat_names():
    """Field names are unique across the sections, so the flat form (flags, presets,
    config.json) round-trips; older config.json names load; Literal fields are checked."""
    from ocpmx.llama_train.config import section_fields
    names = [f.name for _, f, _ in section_fields()]
    assert len(names) == len(set(names))
    c = T.TrainConfig.from_flat(preset="30m", seq_len=256, lr=3e-4, max_steps=7, keep=1,
                                backend="emulator", out="o")
    assert (c.model.preset, c.data.seq_len, c.optimizer.lr, c.training.max_steps,
            c.checkpoint.keep, c.precision.backend, c.logging.out) == \
        ("30m", 256, 3e-4, 7, 1, "emulator", "o")
    assert list(c.to_flat()) == names and T.TrainConfig.from_flat(**c.to_flat()) == c
    assert T.TrainConfig.from_flat(mx_backend="triton").precision.backend == "triton"
    with pytest.raises(TypeError, match="no field 'mx_backnd'"):
        T.TrainConfig.from_flat(mx_backnd="triton")
    assert T.TrainConfig.from_flat(**T.TRAIN_PRESETS["mlperf"]).data.grad_accum == 32
    for name, bad, msg in (("nan_policy", "halt", "'stop' or 'skip', got 'halt'"),
                           ("checkpoint_format", "dcp", "'full' or 'sharded', got 'dcp'"),
                           ("backend", "cuda", "'triton', 'emulator' or None, got 'cuda'")):
        with pytest.raises(ValueError, match=f"{name} must be {msg}"):
            T.TrainConfig.from_flat(**{name: bad}).validate()
    assert T.TrainConfig().validate().n_layers == get_config("tiny").n_layers


def test_cli_flags_come_from_the_sections(capsys):
    """Every field has a flag with a help text (its default, a Literal's choices); --mx-backend
    stays an alias of --backend; booleans take --x / --no-x."""
    from ocpmx.llama_train.config import section_fields
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for _, f, _ in section_fields():
        assert "--" + f.name.replace("_", "-") in text
    assert "(one of stop, skip; default: stop)" in text and "--mx-backend" in text
    args = cli.build_parser().parse_args(
        ["train", "--out", "o", "--mx-backend", "emulator", "--no-progress", "--compile",
         "--betas", "0.9", "0.99", "--seq-len", "64", "--target-loss", "3.5"])
    assert (args.backend, args.progress, args.compile, args.betas, args.seq_len,
            args.target_loss, args.tensorboard, args.max_steps) == \
        ("emulator", False, True, [0.9, 0.99], 64, 3.5, None, None)


def test_cli_train_and_plot(corpus, tmp_path):
    out = tmp_path / "run"
    code = cli.main(["train", "--preset", "tiny", "--recipe", "mxfp4_all_h16", "--max-steps", "4",
                     "--out", str(out), "--data", str(corpus), "--batch-size", "2",
                     "--seq-len", "32", "--eval-every", "2", "--eval-sequences", "2",
                     "--mx-backend", "emulator", "--no-progress"])
    assert code == 0
    rows, val = T.read_metrics(out / "metrics.jsonl")
    assert len(rows) == 4 and len(val) == 2
    assert {"step", "tokens", "loss", "lr", "grad_norm"} <= set(rows[0])
    png = tmp_path / "loss.png"
    assert cli.main(["plot", str(out), "-o", str(png)]) == 0 and png.stat().st_size > 1000


def _torchrun(args, tmp_path, nproc=2):
    import os
    import subprocess
    import sys
    import socket
    with socket.socket() as sock:  # a free port for the rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # PYTHONFAULTHANDLER: a rank that aborts prints every thread's Python stack
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    # --tee 3: each rank's lines prefixed with its rank, so a failure shows whose they are
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           f"--master-port={port}", "--tee", "3", "-m", "ocpmx.cli", "train", *args]
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    # a rank's own last words sit above torchrun's summary (an abort's text names no "Error":
    # keep every rank-prefixed stderr line, the last 40)
    ranks = [ln for ln in done.stderr.splitlines() if ln.startswith("[default")]
    assert done.returncode == 0, "\n".join(ranks[-40:]) + "\n...\n" + done.stderr[-2000:]
    # rank 0's summary, printed before the rank ends without the interpreter's teardown
    assert "[default0]:steps " in done.stdout, done.stdout[-2000:]


def test_fsdp2_two_processes_resume_exactly(corpus, tmp_path):
    """torchrun with 2 CPU processes (gloo): FSDP2 shards the model; a run stopped at step 3
    and resumed gives the uninterrupted run's losses bit for bit, with either checkpoint
    format (one full file, or sharded), and the losses track a single-process run over the
    same global batches (sums in another order). (The uninterrupted run and the
    single-process one do not depend on the format: each runs once.)"""
    def common(fmt):
        return ["--preset", "tiny", "--recipe", "mxfp4_all_sr_wgrad", "--data", str(corpus),
                "--batch-size", "2", "--seq-len", "32", "--eval-every", "3",
                "--eval-sequences", "4", "--save-every", "3", "--warmup-steps", "2",
                "--decay-steps", "6", "--mx-backend", "emulator", "--no-progress",
                "--checkpoint-format", fmt]
    _torchrun([*common("full"), "--max-steps", "6", "--out", str(tmp_path / "full")], tmp_path)
    full, vf = T.read_metrics(tmp_path / "full" / "metrics.jsonl")
    assert len(full) == 6
    for fmt in ("full", "sharded"):
        cut_dir = tmp_path / f"cut_{fmt}"
        _torchrun([*common(fmt), "--max-steps", "3", "--out", str(cut_dir)], tmp_path)
        _torchrun([*common(fmt), "--max-steps", "6", "--out", str(cut_dir), "--resume"],
                  tmp_path)
        cut, vc = T.read_metrics(cut_dir / "metrics.jsonl")
        assert [r["loss"] for r in cut] == [r["loss"] for r in full], fmt
        assert [r["val_loss"] for r in vc] == [r["val_loss"] for r in vf], fmt
        assert json.loads((cut_dir / "config.json").read_text())["checkpoint_format"] == fmt
    assert json.loads((tmp_path / "full" / "config.json").read_text())["world"] == 2
    single = cfg(corpus, tmp_path / "single", max_steps=6, batch_size=4, eval_every=3,
                 save_every=3, decay_steps=6)
    T.train(single)
    one, _ = T.read_metrics(tmp_path / "single" / "metrics.jsonl")
    assert full[0]["tokens"] == one[0]["tokens"] == 128
    for a, b in zip(full, one):
        assert a["loss"] == pytest.approx(b["loss"], rel=2e-2)


def test_activation_checkpointing_and_accumulation(corpus, tmp_path):
    base = T.train(cfg(corpus, tmp_path / "a", max_steps=3, recipe="mxfp4_all_h16"))
    T.train(cfg(corpus, tmp_path / "b", max_steps=3, recipe="mxfp4_all_h16",
                activation_checkpointing=True))
    a, _ = T.read_metrics(tmp_path / "a" / "metrics.jsonl")
    b, _ = T.read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [r["loss"] for r in a] == [r["loss"] for r in b]  # recomputation changes no bit
    assert [r["grad_norm"] for r in a] == [r["grad_norm"] for r in b]
    # two micro-batches of 2 = one batch of 4 (up to summation order)
    T.train(cfg(corpus, tmp_path / "c", max_steps=3, recipe="bf16", batch_size=2, grad_accum=2))
    T.train(cfg(corpus, tmp_path / "d", max_steps=3, recipe="bf16", batch_size=4))
    c, _ = T.read_metrics(tmp_path / "c" / "metrics.jsonl")
    d, _ = T.read_metrics(tmp_path / "d" / "metrics.jsonl")
    assert c[-1]["tokens"] == d[-1]["tokens"] == 3 * 4 * 32
    for x, y in zip(c, d):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-2)
    assert base["tokens_to_target"] is None


def test_target_loss_stops_and_reports_tokens(corpus, tmp_path):
    res = T.train(cfg(corpus, tmp_path, max_steps=8, eval_every=2, target_loss=100.0))
    assert res["tokens_to_target"] == 2 * 2 * 32
    rows, val = T.read_metrics(tmp_path / "metrics.jsonl")
    assert len(rows) == 2 and len(val) == 1
    assert (tmp_path / "checkpoints" / "latest").read_text() == "step_00000001"


def test_torch_compile_path(corpus, tmp_path):
    """--compile compiles the whole model, MXLinear included (its MX operations are custom ops:
    tests/test_compile.py); losses track the eager run (Inductor fuses the norms and RoPE
    differently, which changes their last bits). Here with --compile-mode reduce-overhead and
    two micro-batches a step (on a CPU, Inductor compiles as in the default mode and records no
    CUDA graph; the GPU twin is test_reduce_overhead_trains_like_default_compile)."""
    kw = dict(max_steps=2, recipe="mxfp4_all_h16", grad_accum=2)
    T.train(cfg(corpus, tmp_path / "c", compile=True, compile_mode="reduce-overhead", **kw))
    T.train(cfg(corpus, tmp_path / "e", **kw))
    c, _ = T.read_metrics(tmp_path / "c" / "metrics.jsonl")
    e, _ = T.read_metrics(tmp_path / "e" / "metrics.jsonl")
    assert len(c) == len(e) == 2
    for x, y in zip(c, e):
        assert x["loss"] == pytest.approx(y["loss"], rel=1e-3)
    with pytest.raises(ValueError, match="--compile-mode reduce-overhead needs --compile"):
        cfg(corpus, tmp_path / "x", compile_mode="reduce-overhead").validate()
    with pytest.raises(ValueError, match="compile_mode must be"):
        cfg(corpus, tmp_path / "x", compile=True, compile_mode="fast").validate()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("recipe,method", [("bf16", "auto"), ("mxfp4_all_h16", "auto"),
                                           ("mxfp4_wgrad_rht", "auto"),
                                           ("mxfp4_all", "fp8_cublas"), ("mxfp4_wgrad", "fp8")])
def test_reduce_overhead_trains_like_default_compile(corpus, tmp_path, recipe, method):
    """--compile-mode reduce-overhead on a GPU: each step's forward and backward replay from
    CUDA graphs (the per-step keys are written between replays), with two micro-batches a step
    (gradients accumulate across replays), against the default compile, both under Inductor's
    deterministic mode (no timed choice among its kernel configurations). Step 0's loss is equal
    bit for bit; later steps are held to 1e-3 relative: the two compilations' Inductor
    reductions may still sum differently (on an H100, 2026-11-26, deterministic mode: one MX
    recipe equal in every step, another 4e-7 relative apart from step 2; without it, up to 2.3e-3
    as MXFP4 rounding amplified the last bits). A gradient lost between micro-batches moves the
    gradient norm far more; stale keys are checked bit for bit at the block level
    (``tests/test_compile.py::test_reduce_overhead_block_matches_default_compile_step_by_step``).
    Also with GEMM methods that fold (issue 17): their rounded-element count lives outside the
    graphs' memory pool and both runs count the same."""
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters
    kw = dict(max_steps=4, recipe=recipe, grad_accum=2, backend="triton", device="cuda",
              compile=True, eval_every=4, save_every=0, gemm_method=method,
              # cuBLAS's blockwise FP8 GEMM takes K in multiples of 128: not tiny's 64 nor 64
              # tokens a micro-batch (Wgrad's K)
              **(dict(preset="30m", batch_size=4) if method == "fp8_cublas" else {}))
    with inductor_config.patch(deterministic=True):
        torch._dynamo.reset()
        counters.clear()
        T.train(cfg(corpus, tmp_path / "g", compile_mode="reduce-overhead", **kw))
        # the graphs were recorded and replayed, not skipped (Inductor skips them quietly)
        assert counters["inductor"]["cudagraph_skips"] == 0
        torch._dynamo.reset()
        T.train(cfg(corpus, tmp_path / "d", **kw))
        torch._dynamo.reset()
    g, gv = T.read_metrics(tmp_path / "g" / "metrics.jsonl")
    d, dv = T.read_metrics(tmp_path / "d" / "metrics.jsonl")
    assert len(g) == len(d) == 4 and g[0]["loss"] == d[0]["loss"]
    for key in ("loss", "grad_norm"):
        assert [r[key] for r in g] == pytest.approx([r[key] for r in d], rel=1e-3), key
    if method != "auto":
        assert g[0]["fold_inexact"] == d[0]["fold_inexact"] and "fold_inexact" in g[-1]
    assert [r["val_loss"] for r in gv] == pytest.approx([r["val_loss"] for r in dv], rel=1e-3)


def test_tensorboard_scalars(corpus, tmp_path, monkeypatch):
    """With tensorboard installed, train/* and eval/val_loss scalars are written (a stand-in
    SummaryWriter records them here: CI does not install tensorboard)."""
    import sys
    import types
    written = []

    class Writer:
        def __init__(self, logdir):
            written.append(("dir", logdir))

        def add_scalar(self, tag, value, step):
            written.append((tag, value, step))

        def close(self):
            written.append(("closed",))
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=Writer))
    T.train(cfg(corpus, tmp_path, max_steps=2, eval_every=2))
    tags = {w[0] for w in written}
    assert {"train/loss", "train/lr", "train/grad_norm", "eval/val_loss", "closed"} <= tags
    assert ("dir", str(tmp_path / "tb")) in written


def test_train_preset_sets_the_model_size(monkeypatch, tmp_path):
    """--train-preset mlperf picks the 8b model unless --preset says otherwise."""
    seen = []
    monkeypatch.setattr(T, "train", lambda c, resume=False, overwrite=False:
                        seen.append(c) or {"tokens": 0})
    monkeypatch.setattr(T, "read_metrics", lambda p: ([{"loss": 0.0}], []))
    cli.main(["train", "--train-preset", "mlperf", "--out", str(tmp_path), "--no-progress"])
    cli.main(["train", "--train-preset", "mlperf", "--preset", "30m", "--out", str(tmp_path)])
    cli.main(["train", "--out", str(tmp_path)])
    assert [c.model.preset for c in seen] == ["8b", "30m", "tiny"]
    assert seen[0].data.seq_len == 8192 and seen[0].eval.target_loss == 3.3
    assert seen[2].data.seq_len == 128


def test_layers_make_a_proxy_of_the_preset(corpus, tmp_path, monkeypatch):
    """--layers N builds the preset's shapes with N transformer blocks (config.json records the
    model that ran); None keeps the preset's count; fewer than one is refused, and so is
    resuming a run with another count."""
    T.train(cfg(corpus, tmp_path / "one", recipe="bf16", max_steps=1, eval_every=1,
                save_every=0, layers=1))
    model = json.loads((tmp_path / "one" / "config.json").read_text())["model"]
    assert model["n_layers"] == 1 and model["dim"] == PRESETS["tiny"].dim
    assert cfg(corpus, tmp_path / "x").validate().n_layers == PRESETS["tiny"].n_layers
    assert cfg(corpus, tmp_path / "x", preset="8b", layers=3).validate() == \
        dataclasses.replace(PRESETS["8b"], n_layers=3)
    with pytest.raises(ValueError, match="layers must be >= 1"):
        cfg(corpus, tmp_path / "x", layers=0).validate()
    # a run resumed with another model is refused by name, before its checkpoint is read
    T.train(cfg(corpus, tmp_path / "two", recipe="bf16", max_steps=2, eval_every=2,
                save_every=2))
    with pytest.raises(ValueError, match=r"another model \(n_layers 2 -> 1\)"):
        T.train(cfg(corpus, tmp_path / "two", recipe="bf16", max_steps=4, eval_every=2,
                    save_every=2, layers=1), resume=True)
    seen = []
    monkeypatch.setattr(T, "train", lambda c, resume=False, overwrite=False:
                        seen.append(c) or {"tokens": 0})
    monkeypatch.setattr(T, "read_metrics", lambda p: ([{"loss": 0.0}], []))
    cli.main(["train", "--preset", "8b", "--layers", "2", "--out", str(tmp_path / "c"),
              "--no-progress"])
    assert seen[0].model.layers == 2 and seen[0].model.preset == "8b"


def test_scale_report_times_the_right_steps(corpus, tmp_path):
    """The throughput table from real run files: a run cut at step 4 and resumed to 8, profiled
    at step 5. Warm-up steps, the profiled pair and the first step after the resume are left out
    of the medians; tokens/s per GPU is the step's tokens over the world size."""
    from ocpmx.llama_train import scale_report as S
    root = tmp_path / "runs"
    T.train(cfg(corpus, root / "a", recipe="bf16", max_steps=4, save_every=4, decay_steps=8))
    T.train(cfg(corpus, root / "a", recipe="bf16", max_steps=8, save_every=0, profile_step=5,
                decay_steps=8), resume=True)
    train_rows, _ = T.read_metrics(root / "a" / "metrics.jsonl")
    assert [r["step"] for r in train_rows] == list(range(8))
    kept = S.timed_steps(train_rows, warmup=2, profile_step=5)
    assert [r["step"] for r in kept] == [2, 3, 7]  # 4: first after the resume; 5, 6: profiled
    # synthetic speeds make the medians checkable
    lines = [json.dumps({**r, "tokens_per_s": 1000.0 * (r["step"] + 1), "mfu": 0.01 * r["step"]})
             for r in train_rows]
    (root / "a" / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    cfgj = json.loads((root / "a" / "config.json").read_text())
    (root / "a" / "config.json").write_text(json.dumps({**cfgj, "world": 2}))
    (root / "a" / "memory.json").write_text(json.dumps({"allocated_gb": [3.5, 4.25],
                                                       "reserved_gb": [5.0, 4.5]}))
    rows = S.summarize(root, tmp_path / "rep", warmup=2)
    r = rows[0]
    assert r["run"] == "a" and r["world"] == 2 and r["timed_steps"] == 3
    assert r["tokens_per_s_per_gpu"] == 4000.0 / 2  # median of 3000, 4000, 8000 over 2 GPUs
    assert r["mfu"] == 0.03 and r["max_allocated_gb"] == 4.25 and r["max_reserved_gb"] == 5.0
    assert r["step_s"] == 2 * 32 * 2 / 4000.0
    assert r["gpu_ms_per_step"] == {}  # the CPU profiler finds no GPU kernels
    md = (tmp_path / "rep" / "scale.md").read_text()
    assert "| a | 2 | 2,000 | 3.0% | 0.03 | 4.2 / 5.0 |" in md and (tmp_path / "rep" / "loss.png").is_file()
    assert json.loads((tmp_path / "rep" / "scale.json").read_text())[0]["run"] == "a"


def test_train_under_an_accumulation_model(corpus, tmp_path):
    """--accumulation (issue 23): every MXLinear of the run carries the model, config.json
    records it, the run trains; --compile with it is refused (the emulator's GEMM runs
    eagerly)."""
    c = cfg(corpus, tmp_path / "acc", recipe="mxfp8", max_steps=3, eval_every=3, save_every=0,
            accumulation="hopper_bf16")
    T.train(c)
    rows, _ = T.read_metrics(tmp_path / "acc" / "metrics.jsonl")
    assert len(rows) == 3 and all(math.isfinite(r["loss"]) for r in rows)
    assert json.loads((tmp_path / "acc" / "config.json").read_text())["accumulation"] == \
        "hopper_bf16"
    model, *_ = T.build(c, T.setup_dist("cpu"))
    layers = [m for m in model.modules() if isinstance(m, MXLinear)]
    assert layers and all(m.context.accumulation == "hopper_bf16" for m in layers)
    with pytest.raises(ValueError, match="accumulation models run eagerly"):
        cfg(corpus, tmp_path / "x", accumulation="hopper_bf16", compile=True).validate()


def test_train_with_a_fold_gemm_method(corpus, tmp_path):
    """--gemm-method (issue 17): every MXLinear carries it, config.json records the method that
    ran (auto resolved; the emulator backend and accumulation models named as such), and a fold
    method logs the running count of rounded fold elements in every metrics row (through the
    Triton interpreter on CPU: one step). --accumulation beside it is refused."""
    c = cfg(corpus, tmp_path / "fp8", recipe="mxfp4_all_h16", max_steps=1, eval_every=1,
            eval_sequences=2, save_every=0, backend="triton", gemm_method="fp8")
    T.fold.inexact_total("cpu").fill_(10**9)  # an earlier run's count: the run starts from 0
    T.train(c)
    rows, _ = T.read_metrics(tmp_path / "fp8" / "metrics.jsonl")
    assert len(rows) == 1 and math.isfinite(rows[0]["loss"])
    assert 0 <= rows[0]["fold_inexact"] == int(T.fold.inexact_total("cpu").item()) < 10**9
    facts = json.loads((tmp_path / "fp8" / "config.json").read_text())
    assert facts["gemm_method_run"] == "fp8"
    assert facts["linear_both_axes_run"] is False  # (a fold method: no both-axes pass)
    assert facts["tuning_run"] == json.loads(json.dumps(
        dataclasses.asdict(T.default_tuning(torch.device("cpu")))))
    model, *_ = T.build(c, T.setup_dist("cpu"))
    layers = [m for m in model.modules() if isinstance(m, MXLinear)]
    assert layers and all(m.context.method == "fp8" for m in layers)
    assert T.gemm_method_run(model, torch.device("cpu"), 64) == "fp8"
    for kw, want in ((dict(backend="triton"), "dot_scaled"), (dict(backend="emulator"), "emulator"),
                     (dict(accumulation="hopper_bf16"), "accumulation hopper_bf16"),
                     (dict(recipe="bf16"), None)):
        m, *_ = T.build(cfg(corpus, tmp_path / "x", **kw), T.setup_dist("cpu"))
        assert T.gemm_method_run(m, torch.device("cpu"), 64) == want, kw
        both = T.linear_both_axes_run(T.gemm_method_run(m, torch.device("cpu"), 64),
                                      torch.device("cpu"))
        assert both is (None if want is None else False), (kw, both)  # (none of method bf16)
    with pytest.raises(ValueError, match="drop --gemm-method fp8"):
        cfg(corpus, tmp_path / "y", accumulation="hopper_bf16", gemm_method="fp8").validate()
    # the both-axes fact follows the device's tuning where the GEMMs run method 'bf16'
    m16, *_ = T.build(cfg(corpus, tmp_path / "x", backend="triton", gemm_method="bf16"),
                      T.setup_dist("cpu"))
    cpu = torch.device("cpu")
    for flag in (True, False):
        tuned = dataclasses.replace(T.default_tuning("cpu"), linear_both_axes=flag)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(T, "default_tuning", lambda device, tuned=tuned: tuned)
            assert T.linear_both_axes_run(T.gemm_method_run(m16, cpu, 64), cpu) is flag
            assert T.linear_both_axes_run(T.gemm_method_run(model, cpu, 64), cpu) is False
    # 'auto' on Hopper by layer size (native.gemm.HOPPER_AUTO_LARGE_MNK, lowered here to the
    # tiny model's FFN layers at 64 tokens, 64 x 192: its attention projections stay 'bf16')
    from ocpmx import native
    mauto, *_ = T.build(cfg(corpus, tmp_path / "x", backend="triton"), T.setup_dist("cpu"))
    with pytest.MonkeyPatch.context() as mp:
        __import__("native_util").as_hopper(mp)
        mp.setattr(native.gemm, "HOPPER_AUTO_LARGE_MNK", 64 * 64 * 192)
        assert T.gemm_method_run(mauto, cpu, 64) == "bf16 + fp8_cublas_rowwise"
        assert T.methods_of("bf16 + fp8_cublas_rowwise") == {"bf16", "fp8_cublas_rowwise"}
        assert T.gemm_method_run(mauto, cpu, 32) == "bf16"  # (32 tokens: below it)
        tuned = dataclasses.replace(T.default_tuning("cpu"), linear_both_axes=True)
        mp.setattr(T, "default_tuning", lambda device, tuned=tuned: tuned)
        assert T.linear_both_axes_run(T.gemm_method_run(mauto, cpu, 64), cpu) is True
        mp.setattr(native.gemm, "HOPPER_AUTO_LARGE_MNK", 1)
        assert T.gemm_method_run(mauto, cpu, 64) == "fp8_cublas_rowwise"
        assert T.linear_both_axes_run(T.gemm_method_run(mauto, cpu, 64), cpu) is False


def test_training_with_the_both_axes_pass_keeps_its_bits(corpus, tmp_path, monkeypatch):
    """Training through the Triton kernels (the interpreter; GEMM method 'bf16', what Hopper's
    'auto' runs) with ``Tuning.linear_both_axes`` on (the H100's default) gives the losses and gradient norms of training with it off, bit
    for bit, also with activation checkpointing (the pass recomputed in the backward); the
    pass ran, and config.json records it."""
    import dataclasses
    from ocpmx.native import linear
    calls = []
    real = linear.quantize_dequantize_both_axes

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(linear, "quantize_dequantize_both_axes", counted)
    runs = {}
    for name, both, ac in (("off", False, False), ("on", True, False), ("on_ac", True, True)):
        tuned = dataclasses.replace(T.default_tuning("cpu"), linear_both_axes=both)
        monkeypatch.setattr(linear, "default_tuning", lambda device=None, t=tuned: t)
        monkeypatch.setattr(T, "default_tuning", lambda device=None, t=tuned: t)
        calls.clear()
        T.train(cfg(corpus, tmp_path / name, recipe="mxfp4_all", backend="triton",
                    gemm_method="bf16", max_steps=2, eval_every=2, eval_sequences=2,
                    save_every=0, activation_checkpointing=ac))
        assert bool(calls) is both, name
        rows, _ = T.read_metrics(tmp_path / name / "metrics.jsonl")
        runs[name] = [(r["loss"], r["grad_norm"]) for r in rows]
        facts = json.loads((tmp_path / name / "config.json").read_text())
        assert facts["linear_both_axes_run"] is both
        assert facts["tuning_run"]["linear_both_axes"] is both  # (the tiles the run took)
        assert facts["tuning_run"]["both_axes"] == list(tuned.both_axes)
    assert len(runs["off"]) == 2 and runs["on"] == runs["off"] == runs["on_ac"]

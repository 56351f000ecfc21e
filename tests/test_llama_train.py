"""llama_train: model sizes, the C4-layout data path, exact resume, NaN policy, bad configs."""
import json
import math

import pytest
import torch

from ocpmx import cli
from ocpmx.llama_train import train as T
from ocpmx.llama_train.corpus import build_corpus
from ocpmx.llama_train.data import TokenStream, load_tokenizer, train_tokenizer, validation_set
from ocpmx.llama_train.model import PRESETS, Llama, get_config, rope_frequencies


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("c4mini")
    build_corpus(d)
    train_tokenizer(d, d / "tokenizer.json", vocab_size=512)
    return d


def cfg(corpus, out, **kw):
    base = dict(preset="tiny", recipe="mxfp4_all_sr_wgrad", out=str(out), data=str(corpus),
                max_steps=8, batch_size=2, seq_len=32, warmup_steps=2, eval_every=4,
                eval_sequences=4, save_every=4, progress=False, mx_backend="emulator")
    base.update(kw)
    return T.TrainConfig(**base)


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


def test_resume_is_bit_exact(corpus, tmp_path):
    T.train(cfg(corpus, tmp_path / "full"))
    T.train(cfg(corpus, tmp_path / "cut", max_steps=4, decay_steps=8))
    T.train(cfg(corpus, tmp_path / "cut", max_steps=8), resume=True)
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
    for name in ("model.safetensors", "optimizer.safetensors", "state.json"):
        assert (ck / "step_00000007" / name).is_file()


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
    c = T.TrainConfig(lr=1e-3, warmup_steps=10, max_steps=110, min_lr_ratio=0.1)
    assert T.lr_at(0, c) == pytest.approx(1e-4) and T.lr_at(9, c) == pytest.approx(1e-3)
    assert T.lr_at(60, c) == pytest.approx(0.55e-3) and T.lr_at(110, c) == pytest.approx(1e-4)


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

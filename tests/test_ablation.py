"""The ablation driver, its summary, and the Wgrad error analysis (CPU, tiny model)."""
import json
import math

import pytest

from ocpmx import cli, emulator
from ocpmx.emulator.stats import error_stats
from ocpmx.llama_train import ablation as A
from ocpmx.llama_train import gradient_error as G
from ocpmx.llama_train import train as T
from ocpmx.llama_train.data import TokenStream
from ocpmx.native import RECIPES
from ocpmx.native.recipes import GemmRecipe


def test_plan_puts_every_arm_before_extra_seeds():
    p = A.plan()
    assert len(p) == 10 + 2 * 3 and len(set(p)) == len(p)
    assert p[:10] == [(a, 0) for a in A.ARMS]
    assert sorted(p[10:]) == sorted((a, s) for a in A.SEEDED_ARMS for s in (1, 2))
    assert set(A.ARMS) <= set(RECIPES)


def _write_run(out, arm, seed, curve, status="done", skipped=0):
    d = A.run_dir(out, arm, seed)
    d.mkdir(parents=True)
    rows = []
    for i, (t, v) in enumerate(curve):
        rows.append({"step": i, "tokens": t, "loss": v, "lr": 1e-3, "grad_norm": 1.0,
                     "tokens_per_s": 1000.0, "mfu": 0.1, "skipped": skipped})
        rows.append({"step": i, "tokens": t, "val_loss": v})
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "status.json").write_text(json.dumps({"status": status}))


def test_summary_measures_extra_tokens(tmp_path):
    """An arm whose curve is the reference's stretched by 1.1 in tokens needs 10% more tokens;
    one that never gets there is flagged as not reached."""
    f = lambda t: 3.0 + 5.0 / math.sqrt(t)  # noqa: E731 - a decreasing loss curve
    tokens = list(range(1000, 100_001, 1000))
    for s in (0, 1):
        _write_run(tmp_path, "bf16", s, [(t, f(t) + 0.01 * s) for t in tokens])
        _write_run(tmp_path, "mxfp4_all", s, [(t, f(t / 1.1) + 0.01 * s) for t in tokens])
    _write_run(tmp_path, "mxfp4_all_sr_wgrad", 0, [(t, f(t / 2)) for t in tokens],
               status="diverged", skipped=3)
    table = A.summarize(tmp_path)
    rows = {r["arm"]: r for r in table["rows"]}
    assert rows["bf16"]["extra_tokens_mean"] == pytest.approx(0, abs=1e-3)
    # linear interpolation between evaluations 1000 tokens apart: within 0.2%
    assert rows["mxfp4_all"]["extra_tokens_mean"] == pytest.approx(0.10, abs=2e-3)
    assert rows["mxfp4_all"]["final_val_loss_std"] == pytest.approx(0.01 / math.sqrt(2), rel=1e-6)
    sr = rows["mxfp4_all_sr_wgrad"]
    assert sr["reached"] == [False]
    assert any("diverged" in x for x in sr["flags"]) and any("3 skipped" in x for x in sr["flags"])
    # the largest same-seed gap after 10% of the budget: at 10,000 tokens for the 2x stretch
    assert sr["max_val_gap"] == pytest.approx(f(11_000 / 2) - f(11_000), rel=1e-9)
    assert rows["mxfp4_all"]["max_val_gap"] == pytest.approx(f(11_000 / 1.1) - f(11_000), rel=1e-9)
    md = (tmp_path / "table.md").read_text()
    assert "| mxfp4_all | 2 |" in md and "> +33 %" in md and "max gap" in md
    assert (tmp_path / "val_loss.png").stat().st_size > 10_000


def test_driver_runs_resumes_and_skips(corpus, tmp_path, capsys):
    """Two arms on one CPU slot each, in subprocesses: both finish; a second call skips them;
    a run whose status is removed is resumed from its checkpoint, not restarted."""
    args = ("--preset", "tiny", "--seq-len", "32", "--batch-size", "2", "--max-steps", "4",
            "--warmup-steps", "1", "--eval-every", "2", "--eval-sequences", "2",
            "--save-every", "2", "--no-progress", "--mx-backend", "emulator")
    runs = [("bf16", 0), ("mxfp4_all_h16", 0)]
    res = A.run_ablation(tmp_path, runs, str(corpus), gpus=[], per_gpu=1, train_args=args,
                         poll_s=0.2)
    assert set(res.values()) == {"done"}, [(A.run_dir(tmp_path, *r) / "log.txt").read_text()
                                          for r in runs]
    d = A.run_dir(tmp_path, "mxfp4_all_h16", 0)
    before = (d / "metrics.jsonl").read_text()
    log_len = len((d / "log.txt").read_text())
    assert A.run_ablation(tmp_path, runs, str(corpus), [], 1, args, 0.2) == res
    assert len((d / "log.txt").read_text()) == log_len  # skipped: nothing ran
    (d / "status.json").unlink()
    A.run_ablation(tmp_path, runs, str(corpus), [], 1, args, 0.2)
    assert (d / "metrics.jsonl").read_text() == before  # resumed at the end: nothing new
    assert "commands.txt" in {p.name for p in tmp_path.iterdir()}
    # another plan's batch in the same folder (another model) does not count these as its own
    other = tuple("30m" if a == "tiny" else a for a in args)
    with pytest.raises(ValueError, match="preset 'tiny', not the '30m'.*another --out"):
        A.run_ablation(tmp_path, runs, str(corpus), [], 1, other, 0.2)


def test_gpu_slots_round_robin():
    """Runs started together spread over the GPUs: with 2 per GPU, the first two go to
    different GPUs; no GPU means one CPU slot."""
    assert A.gpu_slots(["0", "1", "2"], 2) == ["0", "1", "2", "0", "1", "2"]
    assert A.gpu_slots([], 4) == ["cpu"]


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("bf16run")
    cfg = T.TrainConfig.from_flat(preset="tiny", recipe="bf16", out=str(out), data=str(corpus),
                                  max_steps=3, batch_size=2, seq_len=64, warmup_steps=1,
                                  eval_every=3, eval_sequences=2, save_every=3, progress=False,
                                  tensorboard=False, backend="emulator")
    T.train(cfg)  # the emulator backend: the analysis's quantizes run on it (the interpreter
    return out    # path of the same ops is tested in test_native_*; here it took 4 minutes)


def test_gradient_error_statistics(corpus, trained, tmp_path):
    model, tok, _, dist, _ = G.load_run(trained)
    batch = TokenStream(corpus, tok, 64, seed=9).next_batch(2)
    layers = G.capture(model, batch, dist.device)
    assert len(layers) == 4 * 2 + 3 * 2 and all(x.shape[0] == 128 for _, x, _ in layers)
    treat = G.wgrad_treatments()
    assert set(treat) == {"bf16", "fp8", "mxfp4_all", "mxfp4_all_h16", "mxfp4_all_sr_wgrad",
                          "mxfp4_all_rht_wgrad", "mxfp4_all_rht_fixed_wgrad"}
    assert treat["bf16"][1] == ["bf16", "mxfp4_fprop", "mxfp4_fprop_dgrad"]
    # the same batch four times: a deterministic treatment makes the same error every time
    # (cosine 1, accumulation sqrt(4) = 2); random bits that change per step make it smaller
    K = 4
    res = G.wgrad_error([layers] * K, treat, repeat_step=K + 1000)
    for name in ("mxfp4_all", "mxfp4_all_h16", "mxfp4_all_rht_fixed_wgrad", "bf16"):
        w = res[name]
        assert w["cos_same_batch"] == pytest.approx(1.0, abs=1e-12), name
        assert w["accumulation"] == pytest.approx(2.0, abs=1e-9), name
    for name in ("mxfp4_all_sr_wgrad", "mxfp4_all_rht_wgrad"):
        w = res[name]
        assert w["cos_same_batch"] < 0.9, name
        assert w["accumulation"] < 1.9, name
    assert res["bf16"]["relative_error"] < 0.01 < res["mxfp4_all"]["relative_error"] < 0.5
    assert res["mxfp4_all"]["gradient_accumulation"] == pytest.approx(2.0, abs=1e-9)


def test_load_run_reads_an_older_config(trained, tmp_path):
    """config.json of runs from before the configuration's sections (mx_backend) loads."""
    import shutil
    run = tmp_path / "old"
    shutil.copytree(trained, run)
    conf = json.loads((run / "config.json").read_text())
    conf["mx_backend"] = conf.pop("backend")
    (run / "config.json").write_text(json.dumps(conf))
    _, _, cfg, _, state = G.load_run(run)
    assert state["step"] == 2 and cfg.data.seq_len == 64 and cfg.precision.recipe == "bf16"


def test_load_run_of_a_run_compiled_with_cuda_graphs(trained, tmp_path):
    """A run trained with --compile --compile-mode reduce-overhead loads for the analyses, which
    run eagerly (compile and its mode both dropped)."""
    import shutil
    run = tmp_path / "graphs"
    shutil.copytree(trained, run)
    conf = json.loads((run / "config.json").read_text())
    conf.update(compile=True, compile_mode="reduce-overhead")
    (run / "config.json").write_text(json.dumps(conf))
    _, _, cfg, _, state = G.load_run(run)
    assert state["step"] == 2 and not cfg.training.compile
    assert cfg.training.compile_mode == "default"


def test_saturation_matches_the_emulator_statistics(corpus, trained):
    """The torch statistics against emulator.error_stats, an independent implementation, on the
    real Wgrad operands of one layer, with and without rotation."""
    model, tok, _, dist, _ = G.load_run(trained)
    layers = G.capture(model, TokenStream(corpus, tok, 64, seed=9).next_batch(2), dist.device)
    layer, x, dy = layers[3]
    # a few large outliers so that saturation and flushing both happen
    x = x.clone()
    x[5, :7] *= 300
    s = G.saturation([(layer, x, dy)])
    for rot_name in ("none", "hadamard16"):
        g = GemmRecipe("mxfp4", rotation=rot_name)
        rot = G._ctx(layer, 0).rotation(g, "wgrad")
        mx = emulator.quantize(x.float().numpy(), "e2m1", axis=0, scale_rule=g.scale_rule,
                               rotation=rot)
        ref = error_stats(x.float().numpy(), mx)
        got = s[rot_name]["wgrad.x"]
        assert got["saturated"] == pytest.approx(ref["saturated_fraction"], abs=1.0 / x.numel())
        assert got["zero_flushed"] == pytest.approx(ref["zero_flushed_fraction"],
                                                    abs=1.0 / x.numel())
    assert s["none"]["wgrad.x"]["zero_flushed"] > 0


def test_analyze_writes_the_report(corpus, trained, tmp_path):
    r = G.analyze(str(trained), str(tmp_path), batches=3, batch_size=2, data=str(corpus))
    assert r["checkpoint_step"] == 2 and r["batches"] == 3
    md = (tmp_path / "gradient_error.md").read_text()
    assert "mxfp4, hadamard16" in md and "fprop.x" in md
    assert json.loads((tmp_path / "gradient_error.json").read_text())["wgrad"].keys() == \
        r["wgrad"].keys()


def test_cli_ablate_summarize(tmp_path, capsys):
    tokens = list(range(100, 2001, 100))
    _write_run(tmp_path, "bf16", 0, [(t, 5 - t / 1000) for t in tokens])
    assert cli.main(["ablate", "summarize", "--out", str(tmp_path)]) == 0
    assert "| bf16 | 1 |" in capsys.readouterr().out

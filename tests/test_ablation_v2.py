"""Issue 16 (plan v2, CPU): both evaluation fields, the sequence-level shuffle and its resume,
the wsd schedule and kept checkpoints, the debian-xl corpus builder on fake packages (no
network), the plan's endpoints on synthetic metrics, and the redone mechanism analysis on the
tiny model."""
import gzip
import json
import math
import random
import shutil
import subprocess

import numpy as np
import pytest
import torch

from ocpmx import cli
from ocpmx.llama_train import ablation as A
from ocpmx.llama_train import corpus_extract as E
from ocpmx.llama_train import corpus_xl as X
from ocpmx.llama_train import corpus_xl_packages as P
from ocpmx.llama_train import mechanism as M
from ocpmx.llama_train import train as T
from ocpmx.llama_train.data import SequenceStream, load_tokenizer, tokenize_split, validation_set


def cfg(corpus, out, **kw):
    base = dict(preset="tiny", recipe="bf16", out=str(out), data=str(corpus), max_steps=4,
                batch_size=2, seq_len=32, warmup_steps=1, eval_every=2, eval_sequences=4,
                save_every=2, progress=False, tensorboard=False, backend="emulator")
    base.update(kw)
    return T.TrainConfig.from_flat(**base)


# ---- evaluation: val_loss (bf16 forward of the master weights) and val_loss_recipe ------------

def test_both_evaluation_fields(corpus, tmp_path):
    """bf16: the two fields are equal; an MX recipe: they differ (its forward quantizes); the
    target is checked on val_loss."""
    T.train(cfg(corpus, tmp_path / "b"))
    T.train(cfg(corpus, tmp_path / "m", recipe="mxfp4_all"))
    _, vb = T.read_metrics(tmp_path / "b" / "metrics.jsonl")
    _, vm = T.read_metrics(tmp_path / "m" / "metrics.jsonl")
    assert len(vb) == len(vm) == 2
    assert all(r["val_loss"] == r["val_loss_recipe"] for r in vb)
    assert all(r["val_loss"] != r["val_loss_recipe"] for r in vm)
    assert all(abs(r["val_loss"] - r["val_loss_recipe"]) < 0.5 for r in vm)


def test_bf16_forward_is_the_bf16_arms_and_restores_the_recipe(corpus):
    """Inside bf16_forward an MX model computes exactly what the same weights give in the bf16
    arm's model (MXLinear with recipe bf16, no quantization), and within bf16 rounding what
    plain nn.Linear layers give (those hand bf16 outputs on, where MXLinear hands its input's
    dtype); after it, its recipe's forward again."""
    from ocpmx.llama_train.distributed import Dist
    from ocpmx.llama_train.model import Llama, get_config
    from ocpmx.native import MXLinear, convert_linears
    tok = load_tokenizer(corpus / "tokenizer.json")
    mcfg = get_config("tiny")
    torch.manual_seed(0)
    plain = Llama(mcfg)
    plain.init_weights(0.02, torch.Generator().manual_seed(0))
    mx, arm = Llama(mcfg), Llama(mcfg)
    for m, recipe in ((mx, "mxfp4_all_h16"), (arm, "bf16")):
        m.load_state_dict(plain.state_dict())
        convert_linears(m, recipe, rules=[("output", None)], backend="emulator")
    dist = Dist(rank=0, world=1, device=torch.device("cpu"))
    val = validation_set(corpus, tok, 32, 4)
    before = T.evaluate(mx, val, dist, 2)
    with T.bf16_forward(mx):
        inside = T.evaluate(mx, val, dist, 2)
        assert not T.quantizes(mx)
    assert inside == T.evaluate(arm, val, dist, 2)
    assert inside == pytest.approx(T.evaluate(plain, val, dist, 2), rel=1e-4)
    assert T.evaluate(mx, val, dist, 2) == before != inside
    assert all(m.recipe.name == "mxfp4_all_h16" for m in mx.modules() if isinstance(m, MXLinear))
    both = T.evaluate_both(mx, val, dist, 2)
    assert both == {"val_loss": inside, "val_loss_recipe": before}


# ---- data: the sequence-level shuffle ----------------------------------------------------------

def test_sequence_shuffle_covers_every_window_once_and_resumes_exactly(corpus, tmp_path):
    tok = load_tokenizer(corpus / "tokenizer.json")
    a = SequenceStream(corpus, tok, 32, seed=3)
    n = a.windows
    assert n > 100
    # one epoch: every window exactly once, in an order that is not the file order
    idx = a.next_indices(n)
    assert sorted(idx.tolist()) == list(range(n)) and a.epoch == 1 and a.position == 0
    assert (np.diff(idx) == 1).mean() < 0.05
    # the next epoch draws another permutation; another seed another one
    assert not np.array_equal(a.next_indices(n), idx)
    assert not np.array_equal(SequenceStream(corpus, tok, 32, seed=4).next_indices(n), idx)
    # cut anywhere (across the epoch boundary too) and resumed: the same stream
    full = SequenceStream(corpus, tok, 32, seed=3)
    want = [full.next_batch(7) for _ in range(2 * n // 7 + 3)]
    for cut in (1, n // 7, n // 7 + 1, 2 * n // 7):
        s = SequenceStream(corpus, tok, 32, seed=3)
        for _ in range(cut):
            s.next_batch(7)
        r = SequenceStream(corpus, tok, 32, seed=3, state=json.loads(json.dumps(s.state())))
        for i in range(cut, len(want)):
            assert torch.equal(r.next_batch(7), want[i]), (cut, i)
    # a window is the cache's tokens at stride seq_len; the cache gives the same windows
    d = tmp_path / "c"
    shutil.copytree(corpus, d)
    tokenize_split(d, tok, "train")
    cached = SequenceStream(d, tok, 32, seed=3)
    assert cached.windows == n
    assert torch.equal(cached.next_batch(7), want[0])
    with pytest.raises(ValueError, match="windows of 32 tokens; this split gives"):
        SequenceStream(corpus, tok, 16, seed=3, state=a.state())
    with pytest.raises(ValueError, match="data_order 'shards'"):
        SequenceStream(corpus, tok, 32, seed=3, state={"epoch": 0, "shard": 0, "offset": 0})


def test_training_with_shuffled_sequences_resumes_bit_exactly(corpus, tmp_path):
    kw = dict(data_order="sequences", eval_sampling="spread", schedule="wsd")
    T.train(cfg(corpus, tmp_path / "full", **kw))
    T.train(cfg(corpus, tmp_path / "cut", max_steps=2, decay_steps=4, **kw))
    T.train(cfg(corpus, tmp_path / "cut", **kw), resume=True)
    full, vf = T.read_metrics(tmp_path / "full" / "metrics.jsonl")
    cut, vc = T.read_metrics(tmp_path / "cut" / "metrics.jsonl")
    assert [r["loss"] for r in cut] == [r["loss"] for r in full] and len(full) == 4
    assert [r["val_loss"] for r in vc] == [r["val_loss"] for r in vf]
    state = json.loads((tmp_path / "cut" / "checkpoints" / "step_00000003" / "state.json")
                       .read_text())
    assert state["data"]["order"] == "sequences" and state["data"]["position"] == 4 * 2
    with pytest.raises(ValueError, match="taken with data_order 'sequences'"):
        T.train(cfg(corpus, tmp_path / "cut", max_steps=6), resume=True)


def test_validation_spread_over_the_split(corpus):
    tok = load_tokenizer(corpus / "tokenizer.json")
    v = validation_set(corpus, tok, 32, 8, sampling="spread")
    first = validation_set(corpus, tok, 32, 8)
    assert v.shape == first.shape == (8, 33) and torch.equal(v[0], first[0])
    assert not torch.equal(v, first)
    with pytest.raises(ValueError, match="were asked for"):
        validation_set(corpus, tok, 32, 10**6, sampling="spread")


def test_wsd_schedule_and_kept_checkpoints(corpus, tmp_path):
    c = T.TrainConfig.from_flat(lr=1e-3, warmup_steps=10, max_steps=110, min_lr_ratio=0.1,
                                schedule="wsd", decay_fraction=0.2)
    lrs = [T.lr_at(s, c) for s in range(110)]
    assert lrs[9] == pytest.approx(1e-3) and all(x == 1e-3 for x in lrs[10:88])
    assert lrs[88] < 1e-3 and lrs[109] == pytest.approx(1e-4)
    assert all(a >= b for a, b in zip(lrs[88:], lrs[89:]))
    T.train(cfg(corpus, tmp_path / "k", max_steps=6, save_every=2, keep=1, keep_steps=[0, 3]))
    ck = sorted(p.name for p in (tmp_path / "k" / "checkpoints").glob("step_*"))
    assert ck == ["step_00000000", "step_00000003", "step_00000005"]


# ---- the recipes and the plan ------------------------------------------------------------------

def test_v2_plan_pairs_every_arm_with_every_seed():
    p = A.plan_v2()
    assert len(p) == len(A.V2_ARMS) * 3 == len(set(p))
    assert {s for a, s in p if a == "mxfp4_wgrad_sr"} == {0, 1, 2}
    assert p[:5] == [(a, 0) for a in A.V2_PRIMARY]
    assert all(a in A.V2_PRIMARY for a, _ in p[:15])
    args = A.PLANS["v2"]["train_args"]
    steps = int(args[args.index("--max-steps") + 1])
    assert steps * A.V2_TOKENS_PER_STEP >= 250e6
    c = T.TrainConfig.from_flat(**{k: v for k, v in cli.build_parser().parse_args(
        ["train", "--out", "o", *args]).__dict__.items()
        if k in T.TrainConfig().to_flat() and v is not None})
    assert c.data.data_order == "sequences" and c.optimizer.schedule == "wsd"
    assert c.eval.eval_sampling == "spread" and c.training.compile
    assert A.V2_ANALYSIS_STEPS == (953, 1907)
    # the analyzed run keeps those checkpoints (PLAN.md: bf16 seed 2 since the eleventh session)
    assert A.V2_EXTRA_ARGS[A.V2_MECHANISM_RUN] == ("--keep-steps", "953", "1907")
    # the 125m stage (PLAN.md, Stage 2): the three Wgrad arms, the model the one change
    s2 = A.PLANS["v2-125m"]
    assert s2["arms"] == ("bf16", "mxfp4_wgrad", "mxfp4_wgrad_h16")
    diff = [(a, b) for a, b in zip(args, s2["train_args"]) if a != b]
    assert diff == [("30m", "125m")] and len(s2["train_args"]) == len(args)
    assert s2["plan"](s2["arms"])[:3] == [("bf16", 0), ("mxfp4_wgrad", 0), ("mxfp4_wgrad_h16", 0)]
    from ocpmx.native import RECIPES
    assert set(A.V2_ARMS) <= set(RECIPES)


# ---- summarize_v2: the plan's endpoints ----------------------------------------------------------

def _write(out, arm, seed, curve, recipe_shift=0.0, legacy=False):
    d = A.run_dir(out, arm, seed)
    d.mkdir(parents=True)
    rows = []
    for i, (t, v) in enumerate(curve):
        rows.append({"step": i, "tokens": t, "loss": v, "lr": 1e-3, "grad_norm": 1.0,
                     "tokens_per_s": 1.0, "mfu": 0.1, "skipped": 0})
        ev = {"step": i, "tokens": t, "val_loss": v}
        if not legacy:
            ev["val_loss_recipe"] = v + recipe_shift
        rows.append(ev)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "status.json").write_text(json.dumps({"status": "done"}))


def test_summarize_v2_endpoints(tmp_path):
    """Curves with known offsets: the paired differences, their t-intervals, the verdicts, and
    tokens-to-target against one target (bf16's mean at 40%) in stretched-token arms."""
    f = lambda t: 3.0 + 50.0 / math.sqrt(t)  # noqa: E731
    tokens = list(range(1000, 100_001, 1000))
    noise = {0: 0.0, 1: 0.004, 2: -0.004}
    for s in (0, 1, 2):
        _write(tmp_path, "bf16", s, [(t, f(t) + 0.01 * s) for t in tokens])
        # Wgrad-only MXFP4: 20% more tokens for the same loss; its own forward 0.05 worse
        _write(tmp_path, "mxfp4_wgrad", s, [(t, f(t / 1.2) + 0.01 * s) for t in tokens],
               recipe_shift=0.05)
        # H16 on top: back to bf16's curve up to per-seed noise
        _write(tmp_path, "mxfp4_wgrad_h16", s, [(t, f(t) + 0.01 * s + noise[s]) for t in tokens])
    t = A.summarize_v2(tmp_path)
    e = {x["endpoint"]: x for x in t["endpoints"]}
    assert set(e) == {"wgrad_cost", "h16_on_wgrad"} and all(x["primary"] for x in e.values())
    gap = f(100_000 / 1.2) - f(100_000)
    w = e["wgrad_cost"]
    assert w["val_loss"]["mean"] == pytest.approx(gap, abs=1e-12)
    assert w["val_loss"]["sd"] == pytest.approx(0.0, abs=1e-12)
    assert w["verdict"] == "present"
    assert w["val_loss_recipe"]["mean"] == pytest.approx(gap + 0.05, abs=1e-12)
    h = e["h16_on_wgrad"]
    d = [noise[s] - gap for s in (0, 1, 2)]
    m, sd = sum(d) / 3, 0.004
    assert h["val_loss"]["mean"] == pytest.approx(m, abs=1e-12)
    assert h["val_loss"]["sd"] == pytest.approx(sd, rel=1e-9)
    half = 4.303 * sd / math.sqrt(3)
    assert h["val_loss"]["ci95"] == pytest.approx([m - half, m + half], abs=1e-9)
    assert h["verdict"] == "helps"
    # the target: bf16's mean val_loss at 40% of 100,000 tokens, one number for all seeds
    assert t["target_val_loss"] == pytest.approx(f(40_000) + 0.01, abs=1e-12)
    arm = t["arms"]["mxfp4_wgrad"]
    for s in (0, 1, 2):  # reaches bf16's seed-s loss 1.2x later (linear interpolation)
        assert arm["extra_tokens"][s] == pytest.approx(0.2, abs=5e-3)
    md = (tmp_path / "v2_table.md").read_text()
    assert "**wgrad_cost**" in md and "present" in md and "val_loss_recipe" in md
    assert (tmp_path / "val_loss_v2.png").stat().st_size > 10_000
    assert cli.main(["ablate", "summarize", "--plan", "v2", "--out", str(tmp_path)]) == 0


def test_wall_eta_counts_evaluations_and_passes_midnight():
    """``wall_eta`` (the device script's poll): the rate over the last window of log lines,
    evaluation pauses included, not the training steps' own rate; the clock may pass midnight;
    fewer than two step lines give None."""
    lines = ["23:56:00 no checkpoint in /x: starting from step 0", "23:56:00 step 0/1000  loss 9"]
    t = 23 * 3600 + 58 * 60  # the first 10 steps took 2 minutes (the compile): out of the window
    for step in range(10, 501, 10):  # 10 steps in 5 s, then a 5 s evaluation every 50 steps
        t += 5
        lines.append(f"{t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d} step {step}/1000  "
                     f"loss 3.0  lr 1e-3  tokens/s 131,072  ETA 0:04:10")
        if step % 50 == 0:
            t += 5
            lines.append(f"{t // 3600 % 24:02d}:{t // 60 % 60:02d}:{t % 60:02d} "
                         f"step {step}/1000  validation loss 3.1")
    assert t > 86400  # past midnight
    rate, left, last = A.wall_eta(lines, window_s=90.0)
    assert rate == pytest.approx(100 / 60)  # 50 steps take 30 s of wall time, not 25
    assert left == pytest.approx(500 * 60 / 100)
    assert last == t % 86400
    # a window shorter than the last evaluation: the rate from the step line before it
    assert A.wall_eta(lines, window_s=2.0)[0] == pytest.approx(10 / 10)
    assert A.wall_eta(lines, window_s=1e9)[0] == pytest.approx(500 / (t - 23 * 3600 - 56 * 60))
    assert A.wall_eta(lines[:2]) is None and A.wall_eta([]) is None


def test_a_run_whose_exit_was_not_seen(tmp_path):
    """No status.json (the machine went back before the process exited): the run counts when its
    metrics hold the training row and the evaluation of config.json's last step, and its row
    says so; one step short, or no config.json, it stays incomplete."""
    tokens = list(range(1000, 10_001, 1000))
    f = lambda t: 3.0 + 50.0 / math.sqrt(t)  # noqa: E731
    for s in (0, 1):  # MXFP4 in Wgrad: 20% more tokens for the same loss
        _write(tmp_path, "bf16", s, [(t, f(t)) for t in tokens])
        _write(tmp_path, "mxfp4_wgrad", s, [(t, f(t / 1.2)) for t in tokens])
    d = A.run_dir(tmp_path, "mxfp4_wgrad", 1)
    (d / "status.json").unlink()
    assert A.load_runs(tmp_path)["mxfp4_wgrad"][1]["status"] == "incomplete"  # no config.json
    (d / "config.json").write_text(json.dumps({"max_steps": len(tokens)}))
    assert A.load_runs(tmp_path)["mxfp4_wgrad"][1]["status"] == A.EXIT_NOT_SEEN
    t = A.summarize_v2(tmp_path)
    arm = t["arms"]["mxfp4_wgrad"]
    assert arm["seeds"] == [0, 1] and arm["incomplete"] == [] and arm["exit_not_seen"] == [1]
    w = {x["endpoint"]: x for x in t["endpoints"]}["wgrad_cost"]
    assert w["val_loss"]["mean"] == pytest.approx(f(10_000 / 1.2) - f(10_000), abs=1e-12)
    assert w["seeds"] == [0, 1]
    assert "exit not seen (metrics complete, final checkpoint unknown): seeds [1]" in (
        tmp_path / "v2_table.md").read_text()
    # the last step trained but not evaluated: incomplete, out of the table
    m = d / "metrics.jsonl"
    m.write_text("".join(m.read_text().splitlines(keepends=True)[:-1]))
    assert A.load_runs(tmp_path)["mxfp4_wgrad"][1]["status"] == "incomplete"
    arm = A.summarize_v2(tmp_path)["arms"]["mxfp4_wgrad"]
    assert arm["seeds"] == [0] and arm["incomplete"] == [1] and arm["exit_not_seen"] == []
    # extra tokens are percentages with one seed (no interval) as with several
    row = [l for l in (tmp_path / "v2_table.md").read_text().splitlines()
           if l.startswith("| mxfp4_wgrad |")][0]
    assert f"| {100 * arm['extra_tokens'][0]:+.1f} % (n = 1) |" in row


def test_summarize_against_another_stage(tmp_path):
    """``against`` (Stage 2 against the 30m block): each endpoint's mean there and the ratio
    here / there, in the table and its markdown; through the CLI too; a missing folder and the
    option under --plan v1 are one-line errors."""
    f = lambda t: 3.0 + 50.0 / math.sqrt(t)  # noqa: E731
    tokens = list(range(1000, 100_001, 1000))
    for stage, stretch, back in (("s30", 1.1, 1.05), ("s125", 1.3, 1.1)):
        for s in (0, 1, 2):
            _write(tmp_path / stage, "bf16", s, [(t, f(t) + 0.01 * s) for t in tokens])
            _write(tmp_path / stage, "mxfp4_wgrad", s,
                   [(t, f(t / stretch) + 0.01 * s + 0.001 * s) for t in tokens])
            _write(tmp_path / stage, "mxfp4_wgrad_h16", s,
                   [(t, f(t / back) + 0.01 * s) for t in tokens])
    t = A.summarize_v2(tmp_path / "s125", against=tmp_path / "s30")
    gap = lambda k: f(100_000 / k) - f(100_000)  # noqa: E731
    sc = {r["endpoint"]: r for r in t["scale"]}
    assert sc["wgrad_cost"]["ratio"] == pytest.approx((gap(1.3) + 0.001) / (gap(1.1) + 0.001))
    assert sc["h16_on_wgrad"]["ratio"] == pytest.approx(
        (gap(1.1) - gap(1.3) - 0.001) / (gap(1.05) - gap(1.1) - 0.001))
    assert sc["wgrad_cost"]["there"]["n"] == 3
    md = (tmp_path / "s125" / "v2_table.md").read_text()
    assert f"{sc['wgrad_cost']['ratio']:.2f} |" in md and "ratio here / there" in md
    assert "scale" not in A.summarize_v2(tmp_path / "s30", write=False)
    assert cli.main(["ablate", "summarize", "--plan", "v2-125m", "--out", str(tmp_path / "s125"),
                     "--against", str(tmp_path / "s30")]) == 0
    assert cli.main(["ablate", "summarize", "--plan", "v2-125m", "--out", str(tmp_path / "s125"),
                     "--against", str(tmp_path / "nowhere")]) == 2
    assert cli.main(["ablate", "summarize", "--plan", "v1", "--out", str(tmp_path / "s125"),
                     "--against", str(tmp_path / "s30")]) == 2


def test_stated_verdicts_follow_the_plan(tmp_path):
    """What the table states: provisional below the planned 3 seeds; h16_on_wgrad withheld
    unless wgrad_cost is present (PLAN.md: judged only then), whatever its own interval says."""
    def ep(name, rule, n):
        return {"endpoint": name, "rule": rule, "val_loss": {"n": n}}
    inconclusive = ep("wgrad_cost", "inconclusive", 2)
    h16 = ep("h16_on_wgrad", "no effect", 2)
    by = {"wgrad_cost": inconclusive, "h16_on_wgrad": h16}
    assert A.stated_verdict(inconclusive, by) == "provisional: inconclusive (n = 2 of 3)"
    assert A.stated_verdict(h16, by) == (
        "not judged (wgrad_cost: provisional: inconclusive (n = 2 of 3))")
    present = ep("wgrad_cost", "present", 3)
    h16 = ep("h16_on_wgrad", "helps", 3)
    by = {"wgrad_cost": present, "h16_on_wgrad": h16}
    assert A.stated_verdict(present, by) == "present"
    assert A.stated_verdict(h16, by) == "helps"
    assert A.stated_verdict(h16, {"h16_on_wgrad": h16}) == "not judged (wgrad_cost: not run)"
    # judged on a gate that is itself provisional (a seed of the gate's arms missing): provisional
    by = {"wgrad_cost": ep("wgrad_cost", "present", 2), "h16_on_wgrad": h16}
    assert A.stated_verdict(h16, by) == "provisional: helps (wgrad_cost n = 2 of 3)"
    by["h16_on_wgrad"] = ep("h16_on_wgrad", "helps", 2)
    assert A.stated_verdict(by["h16_on_wgrad"], by) == (
        "provisional: helps (n = 2 of 3; wgrad_cost n = 2 of 3)")
    assert A.stated_verdict(ep("all_cost", "not enough seeds", 1), {}) == "not enough seeds"
    # through summarize: two seeds of a clear cost -> provisional, and h16 judged (gate present)
    f = lambda t: 3.0 + 50.0 / math.sqrt(t)  # noqa: E731
    tokens = list(range(1000, 100_001, 1000))
    for s in (0, 1):
        _write(tmp_path, "bf16", s, [(t, f(t) + 0.01 * s) for t in tokens])
        _write(tmp_path, "mxfp4_wgrad", s, [(t, f(t / 1.2) + 0.011 * s) for t in tokens])
        _write(tmp_path, "mxfp4_wgrad_h16", s, [(t, f(t / 1.2) + 0.012 * s) for t in tokens])
    e = {x["endpoint"]: x for x in A.summarize_v2(tmp_path)["endpoints"]}
    assert e["wgrad_cost"]["rule"] == "present"
    assert e["wgrad_cost"]["verdict"] == "provisional: present (n = 2 of 3)"
    assert e["h16_on_wgrad"]["verdict"].endswith("(n = 2 of 3; wgrad_cost n = 2 of 3)")
    assert "provisional: present (n = 2 of 3)" in (tmp_path / "v2_table.md").read_text()


def test_plot_shows_the_seed_spread(tmp_path):
    """The plot's curves are seed means; an arm with two or more seeds also gets a band from its
    lowest to its highest seed (a one-seed arm none)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tokens = list(range(1000, 10_001, 1000))
    for s in (0, 1):
        _write(tmp_path, "bf16", s, [(t, 4.0 - t / 1e4 + 0.01 * s) for t in tokens])
        _write(tmp_path, "mxfp4_wgrad", s, [(t, 4.0 - t / 1e4 + 0.03 * s) for t in tokens])
    _write(tmp_path, "mxfp4_wgrad_h16", 0, [(t, 4.0 - t / 1e4) for t in tokens])
    runs = A.load_runs(tmp_path)
    fig, axes = plt.subplots(1, 2)
    A._plot_field(axes, runs, "val", "val_loss", "bf16", A.V2_ARMS, A.V2_PRIMARY)
    loss_ax, gap_ax = axes
    assert len(loss_ax.collections) == 2  # bf16 and mxfp4_wgrad: two seeds each
    assert len(gap_ax.collections) == 1  # the reference's gap is zero: no band
    band = gap_ax.collections[0].get_paths()[0].vertices  # mxfp4_wgrad's gap: 0.00 to 0.02
    assert band[:, 1].min() == pytest.approx(0.0, abs=1e-9)
    assert band[:, 1].max() == pytest.approx(0.02, abs=1e-9)
    plt.close(fig)


def test_verdicts_and_legacy_runs(tmp_path):
    est = lambda m, lo, hi: {"mean": m, "ci95": [lo, hi], "n": 3}  # noqa: E731
    assert A.verdict("wgrad_cost", est(0.05, 0.02, 0.08)) == "present"
    assert A.verdict("wgrad_cost", est(0.005, 0.001, 0.009)) == "absent"  # below the floor
    assert A.verdict("wgrad_cost", est(0.0, -0.02, 0.02)) == "absent"
    assert A.verdict("wgrad_cost", est(0.02, -0.01, 0.05)) == "inconclusive"
    assert A.verdict("h16_on_wgrad", est(-0.05, -0.08, -0.02)) == "helps"
    assert A.verdict("h16_on_wgrad", est(0.0, -0.02, 0.02)) == "no effect"
    assert A.verdict("h16_on_wgrad", est(-0.02, -0.05, 0.01)) == "inconclusive"
    assert A.verdict("h16_on_wgrad", {"mean": 0.1, "ci95": None, "n": 1}) == "not enough seeds"
    # a run from before the two fields: flagged, its val_loss read as the recipe's
    _write(tmp_path, "bf16", 0, [(100, 4.0), (200, 3.5)], legacy=True)
    runs = A.load_runs(tmp_path)
    assert runs["bf16"][0]["legacy_eval"] and runs["bf16"][0]["val_recipe"][-1] == (200, 3.5)
    t = A.summarize(tmp_path)
    assert "recipe's forward (before issue 16)" in (tmp_path / "table.md").read_text()
    assert t["rows"][0]["final_val_loss_recipe_mean"] == 3.5


def test_scale_report_shows_both_fields():
    from ocpmx.llama_train.scale_report import _val
    assert _val({"val_loss": 3.0, "val_loss_recipe": 3.1, "val_loss_is_bf16_forward": True}) \
        == "3.000 / 3.100"
    assert _val({"val_loss": 3.1, "val_loss_recipe": 3.1, "val_loss_is_bf16_forward": False}) \
        == "— / 3.100"


def test_driver_stops_after_a_deadline(corpus, tmp_path):
    """stop_after ends a batch: the running run is stopped without a status (it resumes at the
    next call)."""
    args = ("--preset", "tiny", "--seq-len", "32", "--batch-size", "2", "--max-steps", "100000",
            "--eval-every", "1000", "--save-every", "1000", "--no-progress", "--mx-backend",
            "emulator")
    res = A.run_ablation(tmp_path, [("bf16", 0)], str(corpus), gpus=[], per_gpu=1,
                         train_args=args, poll_s=0.2, stop_after=2.0,
                         extra_args={("bf16", 0): ("--keep-steps", "5")})
    assert list(res.values()) == ["stopped"]
    assert not (A.run_dir(tmp_path, "bf16", 0) / "status.json").exists()
    assert "--keep-steps 5" in (tmp_path / "commands.txt").read_text()


# ---- the debian-xl corpus builder, offline ----------------------------------------------------

WORDS = ("the a protocol message server client field value data packet section document "
         "shall must may option header request response error state time network address "
         "length type is are be with for and of to in on by this that which when").split()


def _prose(rng, n_words=80):
    return " ".join(rng.choice(WORDS) for _ in range(n_words)).capitalize() + "."


def _fake_deb(tmp, name, version, files):
    root = tmp / "roots" / name
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: t <t@example.org>\n"
        "Description: test package\n")
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    debs = tmp / "work" / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    deb = debs / f"{name}_{version}_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)],
                   check=True, capture_output=True)
    return deb


def _fake_packages(tmp):
    import io
    import tarfile
    rng = random.Random(0)
    gz = lambda s: gzip.compress(s.encode())  # noqa: E731
    rfc = {}
    for i in range(30):
        body = "\n\n".join("   " + _prose(rng) for _ in range(6))
        rfc[f"usr/share/doc/RFC/std/rfc{1000 + i}.txt.gz"] = gz(
            f"{'Network Working Group' if i else 'Unique'}\n\n{body}\n\n"
            "Author        Standards Track       [Page 1]"
            f"\n\f\nRFC {1000 + i}        Title         May 1990\n\n   {_prose(rng)}\n")
    shared = rfc["usr/share/doc/RFC/std/rfc1000.txt.gz"]
    html = {f"usr/share/doc/h/p{i}.html": (
        "<html><head><style>x{}</style></head><body><div>Skip navigation links Overview "
        f"Package Class Tree</div><p>{_prose(rng)}</p><p>{_prose(rng)}</p></body></html>"
    ).encode() for i in range(25)}
    man = {"usr/share/man/man1/tool.1.gz": gz(
        ".\\\" comment\n.TH TOOL 1\n.SH NAME\ntool \\- does things\n.SH DESCRIPTION\n"
        + "\n".join(_prose(rng) for _ in range(4)) + "\n.B bold words\n")}
    info = {"usr/share/info/m.info.gz": gz(
        "This is m.info\n\x1f\nFile: m.info,  Node: Top\n\n" + _prose(rng, 120)
        + "\n\x1f\nFile: m.info,  Node: Two\n\n" + _prose(rng, 120) + "\n\x1fTag Table:\n")}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for i in range(3):
            src = (f"/* {_prose(rng, 30)}\n * {_prose(rng, 30)}\n */\nint f{i}(void) "
                   f"{{ return 0; }} // {_prose(rng, 10)}\n").encode()
            ti = tarfile.TarInfo(f"src/f{i}.c")
            ti.size = len(src)
            tar.addfile(ti, io.BytesIO(src))
    pkgs = {"fake-rfc": ("1.0", rfc),
            "fake-rfc-dup": ("2.0", {"usr/share/doc/RFC/x/rfc1000.txt.gz": shared}),
            "fake-html": ("3.1", html), "fake-man": ("1", man), "fake-info": ("1", info),
            "fake-dict": ("1", {"usr/share/dictd/d.dict.dz": gzip.compress(
                "\n\n".join(_prose(rng, 40) for _ in range(40)).encode())}),
            "fake-src": ("1", {"usr/src/fake.tar.xz": buf.getvalue()})}
    for name, (version, files) in pkgs.items():
        _fake_deb(tmp, name, version, files)
    table = {"fake-rfc": ("rfc", P.RFC), "fake-rfc-dup": ("rfc", P.RFC),
             "fake-html": ("manual", P.HTML), "fake-man": ("manual", P.MAN),
             "fake-info": ("manual", P.INFO), "fake-dict": ("dictionary", P.DICT),
             "fake-src": ("comments", [("**/*.tar.xz", "c_comments_tar")])}
    return table


@pytest.mark.skipif(shutil.which("dpkg-deb") is None or shutil.which("apt-get") is None,
                    reason="needs dpkg and apt-get (a Debian machine)")
def test_corpus_builder_on_fake_packages(tmp_path):
    """The debian-xl builder on seven fake .debs already in the work directory (no download):
    every kind extracts, boilerplate and duplicates go, the split is by document, the shards
    are reproducible, and a manifest pins versions and hashes."""
    table = _fake_packages(tmp_path)
    work = tmp_path / "work"
    info = X.build(tmp_path / "a", table=table, n_train_shards=3, val_fraction=0.1,
                   workdir=work, log=lambda *a: None)
    rows = {r["package"]: r for r in info["packages"]}
    assert rows["fake-rfc"]["documents"] == 30 and rows["fake-rfc-dup"]["documents"] == 0
    assert rows["fake-rfc-dup"]["duplicates_dropped"] == 1
    assert rows["fake-html"]["documents"] == 25 and rows["fake-src"]["documents"] == 3
    assert rows["fake-info"]["documents"] >= 1 and rows["fake-man"]["documents"] == 1
    assert rows["fake-dict"]["documents"] >= 1
    assert rows["fake-html"]["version"] == "3.1" and len(rows["fake-html"]["deb_sha256"]) == 64
    docs = {}
    for shard in sorted((tmp_path / "a").glob("c4-*.json.gz")):
        with gzip.open(shard, "rt") as f:
            docs[shard.name] = [json.loads(l)["text"] for l in f]
    every = [d for ds in docs.values() for d in ds]
    assert len(every) == len(set(every)) == info["documents"]
    assert 0 < len(docs["c4-validation.00000-of-00001.json.gz"]) < len(every) // 2
    assert not any("Skip navigation" in d for d in every)   # boilerplate line dropped
    assert not any("[Page 1]" in d for d in every)          # RFC pagination removed
    assert not any("\\-" in d or ".SH" in d for d in every)  # roff removed
    assert any("does things" in d for d in every)
    assert info["characters"] == sum(map(len, every))
    assert set(info["characters_by_category"]) == {"rfc", "manual", "dictionary", "comments"}
    # rebuilt from the manifest: the same versions, the same shards bit for bit, and from the
    # work directory's extraction cache (nothing is extracted again)
    manifest = json.loads((tmp_path / "a" / "MANIFEST.json").read_text())
    assert len(list((work / "docs").glob("*.json.gz"))) == len(table)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(X, "package_documents", None)
        again = X.build(tmp_path / "b", table=table, n_train_shards=3, val_fraction=0.1,
                        workdir=work, manifest=manifest, log=lambda *a: None)
    assert [s["sha256"] for s in again["shards"]] == [s["sha256"] for s in info["shards"]]
    manifest["packages"][0]["deb_sha256"] = "0" * 64
    with pytest.raises(RuntimeError, match="differs from the manifest"):
        X.build(tmp_path / "c", table=table, n_train_shards=3, val_fraction=0.1, workdir=work,
                manifest=manifest, log=lambda *a: None)


@pytest.mark.skipif(shutil.which("dpkg-deb") is None or shutil.which("apt-get") is None,
                    reason="needs dpkg and apt-get (a Debian machine)")
def test_corpus_builder_refuses_a_package_without_documents(tmp_path):
    """A package that gives no document is an error that names it (the v2 corpus got none
    from linux-doc-6.1, whose files are gzipped, and said nothing). A rebuild from a manifest
    is the build it records: its packages (one the table no longer has included), categories
    and rules, not the table's later ones; its options (a differing one is an error); and a
    package it records without a document passes, with a warning."""
    table = _fake_packages(tmp_path)
    work = tmp_path / "work"
    wrong = dict(table, **{"fake-html": ("rfc", [("**/*.htm.gz", "html")])})
    with pytest.raises(RuntimeError, match=r"fake-html: no document from .*no file matches"):
        X.build(tmp_path / "a", table=wrong, n_train_shards=3, workdir=work,
                log=lambda *a: None)
    info = X.build(tmp_path / "b", table=table, n_train_shards=3, workdir=work,
                   log=lambda *a: None)
    manifest = json.loads((tmp_path / "b" / "MANIFEST.json").read_text())
    # the table changed since (rules and category of one package, another gone): the
    # manifest's packages, rules and categories rebuild the same shards
    later = {k: v for k, v in wrong.items() if k != "fake-dict"}
    again = X.build(tmp_path / "c", table=later, n_train_shards=3, workdir=work,
                    manifest=manifest, log=lambda *a: None)
    assert [s["sha256"] for s in again["shards"]] == [s["sha256"] for s in info["shards"]]
    assert again["characters_by_category"] == info["characters_by_category"]
    assert [r["package"] for r in again["packages"]] == [r["package"] for r in info["packages"]]
    with pytest.raises(ValueError, match="n_train_shards"):
        X.build(tmp_path / "e", table=table, n_train_shards=4, workdir=work,
                manifest=manifest, log=lambda *a: None)
    with pytest.raises(ValueError, match="not in the manifest"):
        X.build(tmp_path / "e", packages=["fake-html", "fake-new"], table=table,
                n_train_shards=3, workdir=work, manifest=manifest, log=lambda *a: None)
    # a manifest that records a package without a document rebuilds, with a warning
    row = next(r for r in manifest["packages"] if r["package"] == "fake-html")
    row.update(rules=[["**/*.htm.gz", "html"]], documents=0)
    lines = []
    third = X.build(tmp_path / "d", table=table, n_train_shards=3, workdir=work,
                    manifest=manifest, log=lines.append)
    assert {r["package"]: r["documents"] for r in third["packages"]}["fake-html"] == 0
    assert "warning: fake-html: no document, as in the manifest being rebuilt" in lines
    assert "**/Documentation/**/*.rst.gz" in [g for g, _ in P.XL_PACKAGES["linux-doc-6.1"][1]]


def test_build_corpus_rebuilds_a_manifest_with_its_packages(monkeypatch, tmp_path):
    """``build_corpus(source='debian-xl')`` (``ocpmx data build-corpus``) hands the builder the
    manifest's packages where a manifest is given and no package set is named, the v2 set
    otherwise."""
    from ocpmx.llama_train import corpus
    seen = []
    monkeypatch.setattr(X, "build", lambda out, names, **kw: seen.append(names) or {})
    corpus.build_corpus(tmp_path, "debian-xl", manifest={"packages": []})
    corpus.build_corpus(tmp_path, "debian-xl")
    corpus.build_corpus(tmp_path, "debian-xl", packages="v2", manifest={"packages": []})
    assert seen == [None, P.PACKAGE_SETS["v2"], P.PACKAGE_SETS["v2"]]

def test_source_comments_and_docstrings():
    """v3's code kinds: a '//' inside a string (Go, Rust) starts no comment; consecutive line
    comments make one block, a block comment's leading '*' goes; directives and licence blocks
    are dropped; Python's docstrings and comment runs come in source order, and a file that
    does not parse (Python 2) still gives its comments."""
    go = ("// Copyright 2019 The Go Authors. All rights reserved.\n// Use is governed by a "
          "BSD-style license.\n\n//go:build linux\n\n// Package foo does things with widgets."
          "\n// It is the second line.\npackage foo\n\nvar u = \"http://example.com/x\" // note "
          "on the URL\nvar r = `raw // not a comment`\n/*\n * Block words here.\n */\n"
          "func f() rune { return '/' }\n")
    assert E.code_comments(go, "go") == ("Package foo does things with widgets.\nIt is the "
                                         "second line.\n\nnote on the URL\n\nBlock words here.")
    rs = ("//! Crate docs in words.\n\n/// Returns the thing.\nfn f<'a>(x: &'a str) -> &'a str "
          "{ let s = \"a // b\"; let c = '\"'; x }\n")
    assert E.code_comments(rs, "rust") == "Crate docs in words.\n\nReturns the thing."
    py = ('#!/usr/bin/env python\n# -*- coding: utf-8 -*-\n# Copyright (c) 2010 Someone\n'
          '"""Module words."""\nimport os  # noqa\n# First comment line.\n# Second line.\n'
          'class A:\n    """Class words."""\n    def f(self):\n        """Function words."""\n'
          '        return 1  # type: int\n')
    assert E.python_docs(py) == ("Module words.\n\nFirst comment line.\nSecond line.\n\n"
                                 "Class words.\n\nFunction words.")
    assert E.python_docs('print "two"\n# a comment in Python 2 code\n') == \
        "a comment in Python 2 code"
    # only an encoding line (1-2) is a directive: a comment about decoding is text
    assert E.python_docs("# -*- coding: latin-1 -*-\n# Decoding the header comes first.\n") == \
        "Decoding the header comes first."
    # Rust raw strings: one ending in a backslash or holding '"' flips nothing
    rs = ('let p = r"C:\\";\n// Real comment here, words.\nlet u = "http://example.com/x";\n'
          'let q = r#"a " quote"#;\n/// Parses the thing.\nlet v = "see https://docs.rs/x";\n')
    assert E.code_comments(rs, "rust") == "Real comment here, words.\n\nParses the thing."
    # a block comment left open runs to the end of the file, in linear time
    open_block = "var a = 1\n/* " + "words and more words " * 20000
    assert E.code_comments(open_block, "go").startswith("words and more words")


def test_package_families_expand_in_order():
    """A family stands for the archive's names it matches, sorted, where it is listed; a name
    listed before keeps its place; family_of names the first family that matches."""
    names = ["libb-perl", "liba-perl", "python3-x", "python3-x-dbg", "perl", "python-y-doc",
             "python3-azure"]  # an excluded generated SDK
    fams = list(P.FAMILIES)
    perl, py3 = r"lib.+-perl", r"python3-.+(?<!-dbg)"
    assert perl in fams and py3 in fams
    assert X.expand_families(["libb-perl", perl, py3, "perl"], names) == \
        ["libb-perl", "liba-perl", "python3-x", "perl"]
    assert X.family_of("python3-x") == py3 and X.family_of("python3-x-dbg") is None
    assert X.family_of("python-y-doc") == r"python-.+-doc" and X.family_of("perl") is None
    v3 = P.PACKAGE_SETS["v3"]
    assert v3[:len(P.PACKAGE_SETS["v2"])] == P.PACKAGE_SETS["v2"] and set(fams) <= set(v3)
    assert all(p in P.XL_PACKAGES or p in P.FAMILIES for p in v3)


@pytest.mark.skipif(shutil.which("dpkg-deb") is None or shutil.which("apt-get") is None,
                    reason="needs dpkg and apt-get (a Debian machine)")
def test_corpus_builder_takes_package_families(monkeypatch, tmp_path):
    """A family in the package list expands to the archive's matching names; a member without
    any document is recorded (family, 0 documents) and is no error, while a named package
    without one still is; the manifest rebuilds the same shards."""
    table = _fake_packages(tmp_path)
    rng = random.Random(3)
    _fake_deb(tmp_path, "python3-fakea", "1", {"usr/lib/python3/dist-packages/a.py": (
        f'"""{_prose(rng)}"""\n# {_prose(rng, 20)}\ndef f():\n    """{_prose(rng)}"""\n'
    ).encode()})
    _fake_deb(tmp_path, "python3-fakeb", "1", {"usr/lib/python3/dist-packages/b.py": b"x = 1\n"})
    monkeypatch.setattr(X, "available_packages",
                        lambda work: ["python3-fakea", "python3-fakeb", "python3-fakeb-dbg"])
    work = tmp_path / "work"
    family = r"python3-.+(?<!-dbg)"
    info = X.build(tmp_path / "a", packages=["fake-html", family], table=table,
                   n_train_shards=2, workdir=work, log=lambda *a: None, processes=2)
    rows = {r["package"]: r for r in info["packages"]}
    assert list(rows) == ["fake-html", "python3-fakea", "python3-fakeb"]
    assert rows["python3-fakea"]["documents"] == 1 and rows["python3-fakea"]["family"] == family
    assert rows["python3-fakeb"]["documents"] == 0 and "family" not in rows["fake-html"]
    manifest = json.loads((tmp_path / "a" / "MANIFEST.json").read_text())
    packed = tmp_path / "m.json.gz"
    packed.write_bytes(gzip.compress((tmp_path / "a" / "MANIFEST.json").read_bytes()))
    assert X.read_manifest(packed) == manifest == X.read_manifest(tmp_path / "a" / "MANIFEST.json")
    (tmp_path / "bad.json.gz").write_bytes(gzip.compress(b"not json"))
    (tmp_path / "other.json").write_text("[1, 2]")
    for bad in ("bad.json.gz", "other.json"):
        with pytest.raises(ValueError, match=f"{bad}: not a corpus manifest"):
            X.read_manifest(tmp_path / bad)
    # rebuilt in one process from a fresh work directory (the .debs alone: every package
    # extracted again), with the family named again: its members are the manifest's, not
    # what the archive lists today
    fresh = tmp_path / "fresh"
    shutil.copytree(work / "debs", fresh / "debs")
    monkeypatch.setattr(X, "available_packages", None)
    again = X.build(tmp_path / "b", packages=["fake-html", family, "fake-html"], table=table,
                    n_train_shards=2, workdir=fresh, manifest=manifest, log=lambda *a: None,
                    processes=1)
    assert [r["package"] for r in again["packages"]] == list(rows)
    assert [s["sha256"] for s in again["shards"]] == [s["sha256"] for s in info["shards"]]
    empty = dict(table, **{"fake-b": ("comments", P.PYTHON)})
    _fake_deb(tmp_path, "fake-b", "1", {"usr/lib/python3/dist-packages/b.py": b"x = 1\n"})
    with pytest.raises(RuntimeError, match="fake-b: no document"):
        X.build(tmp_path / "c", packages=["fake-b"], table=empty, n_train_shards=2,
                workdir=work, log=lambda *a: None)


def test_fetch_debs_downloads_in_parallel_and_checks_hashes(monkeypatch, tmp_path):
    """fetch_debs asks apt-get for the URIs (a stand-in apt-get here, file:// URIs), fetches
    them at once, reuses what is there, names a package apt-get does not know, and keeps no
    file whose SHA-256 differs from the list's."""
    import hashlib
    import sys
    pool = tmp_path / "pool"
    pool.mkdir()
    for name in ("pa", "pb", "pbad"):
        (pool / f"{name}_1.0_all.deb").write_bytes(name.encode() * 100)
    fake = tmp_path / "bin" / "apt-get"
    fake.parent.mkdir()
    fake.write_text(f"""#!{sys.executable}
import hashlib, sys, pathlib
args = [a for a in sys.argv[1:] if not a.startswith("-o")]
if args[0] == "update":
    sys.exit(0)
names = [a for a in args[1:] if a != "--print-uris"]
pool = pathlib.Path({str(pool)!r})
def deb(n):
    name, _, version = n.partition("=")
    return pool / f"{{name}}_{{version.replace(':', '%3a') or '1.0'}}_all.deb"
for n in names:
    if not deb(n).exists():
        print(f"E: Unable to locate package {{n}}", file=sys.stderr)
        sys.exit(100)
for n in names:
    f = deb(n)
    data = f.read_bytes()
    if n == "psilent":
        continue
    if n == "p512":
        print(f"'{{f.as_uri()}}' {{f.name}} {{len(data)}} SHA512:{{hashlib.sha512(data).hexdigest()}}")
        continue
    sha = hashlib.sha256(b"other" if n == "pbad" else data).hexdigest()
    print(f"'{{f.as_uri()}}' {{f.name}} {{len(data)}} SHA256:{{sha}}")
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{__import__('os').environ['PATH']}")
    monkeypatch.setattr(X.time, "sleep", lambda s: None)  # the retries' pauses
    work = tmp_path / "work"
    work.mkdir()
    (work / "sources.list").write_text("deb http://example.invalid/debian x main\n")
    got = X.fetch_debs(["pa", "pb"], work, batch=1, connections=2)
    assert {p: d.name for p, d in got.items()} == {"pa": "pa_1.0_all.deb", "pb": "pb_1.0_all.deb"}
    assert got["pa"].read_bytes() == b"pa" * 100
    (pool / "pa_1.0_all.deb").unlink()  # reused: not asked for again
    assert X.fetch_debs(["pa"], work)["pa"].exists()
    # a pinned version with an epoch: the file name carries it as %3a
    (pool / "pe_1%3a2.0_all.deb").write_bytes(b"pe" * 50)
    assert X.fetch_debs(["pe"], work, pins={"pe": "1:2.0"})["pe"].name == "pe_1%3a2.0_all.deb"
    (pool / "pe_1%3a2.0_all.deb").unlink()
    assert X.fetch_debs(["pe"], work, pins={"pe": "1:2.0"})["pe"].exists()  # reused
    # apt names SHA512 where the lists carry it; a package without a URI line is an error
    (pool / "p512_1.0_all.deb").write_bytes(b"p5" * 50)
    assert X.fetch_debs(["p512"], work)["p512"].read_bytes() == b"p5" * 50
    (pool / "psilent_1.0_all.deb").write_bytes(b"ps" * 50)
    with pytest.raises(RuntimeError, match="gave 0 URIs for 1 packages"):
        X.fetch_debs(["psilent"], work)
    with pytest.raises(RuntimeError, match="apt-get download nope failed: E: Unable to locate"):
        X.fetch_debs(["pb", "nope"], work, batch=5)
    with pytest.raises(RuntimeError, match="SHA256 differs.*4 tries"):
        X.fetch_debs(["pbad"], work)
    assert not list((work / "debs").glob("pbad*")), "a file that failed its check is kept"
    assert hashlib.sha256(got["pb"].read_bytes()).hexdigest() == \
        hashlib.sha256(b"pb" * 100).hexdigest()


def test_text_cleaners():
    assert E.rfc_text("   Hello world\n\nAuth   Informational   [Page 1]\n\f\n"
                      "RFC 1   Title   May 1990\n\n   1. Intro ........ 4\n") == \
        "Hello world\n\n1. Intro 4"
    assert E.man_text('.TH X 1\n.SH NAME\nx \\- y\n.B "bold"\n.\\" c\n') == \
        "X 1\n\nNAME\nx - y\nbold"
    assert E.c_comments("/* a\n * b long */ int x; // trailing note\n") == \
        "a\nb long\n\ntrailing note"
    assert E.mostly_words("plain words here") and not E.mostly_words("0x1f 0x2e 0x3d ====")
    docs = [f"doc {i} unique words\nThis line recurs everywhere in the package" for i in range(30)]
    assert E.drop_boilerplate(docs)[0] == "doc 0 unique words"
    assert "sources" not in X.apt_sources().split()[0] and " non-free" in X.apt_sources()


# ---- the mechanism analysis --------------------------------------------------------------------

def test_lagged_products_give_the_projected_statistics():
    """_projected and _window_acc against the direct computation on random vectors with a
    planted common error component."""
    rng = np.random.default_rng(0)
    K, n, L = 12, 50, 4
    G = rng.normal(size=(K, n))
    E = 0.3 * rng.normal(size=(K, n)) + rng.normal(size=n)[None, :]
    ee, eg, ge, gg = (np.full((K, L + 1), np.nan) for _ in range(4))
    for t in range(K):
        for k in range(min(L, t) + 1):
            ee[t, k], eg[t, k] = E[t] @ E[t - k], E[t] @ G[t - k]
            ge[t, k], gg[t, k] = G[t] @ E[t - k], G[t] @ G[t - k]
    p = M._projected(ee, eg, ge, gg)
    Ep = E - (np.sum(E * G, 1) / np.sum(G * G, 1))[:, None] * G
    for t in range(K):
        for k in range(min(L, t) + 1):
            assert p[t, k] == pytest.approx(Ep[t] @ Ep[t - k], rel=1e-9)
    W = 4
    want = [np.linalg.norm(Ep[w:w + W].sum(0)) / math.sqrt((Ep[w:w + W] ** 2).sum())
            for w in range(0, K - W + 1, W)]
    assert M._window_acc(p, W) == pytest.approx(want, rel=1e-9)
    ci = M.block_bootstrap(np.arange(20.0), n=200)
    assert ci[0] < 9.5 < ci[1]


@pytest.fixture(scope="module")
def bf16_run(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("mechrun")
    T.train(cfg(corpus, out, max_steps=3, seq_len=64, save_every=3, keep=1, keep_steps=[0]))
    return out


class _SameBatch:
    def __init__(self, batch):
        self.batch = batch

    def next_batch(self, n):
        return self.batch[:n]


def test_mechanism_on_repeated_batches(corpus, bf16_run):
    """Frozen weights and one batch repeated: a deterministic treatment repeats its error
    (cos1 = 1, accumulation = sqrt(W)); re-drawn signs and stochastic rounding do not."""
    from ocpmx.llama_train.checkpoint import load_checkpoint
    from ocpmx.llama_train.data import TokenStream
    from ocpmx.llama_train.gradient_error import load_run
    model, tok, c, dist, _ = load_run(bf16_run)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-5)
    load_checkpoint(bf16_run, model, opt, dist, step=0)
    batch = TokenStream(corpus, tok, 64, seed=9).next_batch(2)
    r = M.analyze_checkpoint(model, opt, _SameBatch(batch), c, dist, 1, batches=4, max_lag=3,
                             window=4, advance=False, fractions_every=2, bootstrap=50)
    tr = r["treatments"]
    for q in ("none", "h16"):
        m = tr[q]["scopes"]["model"]
        # <E_t, E_t-1> reads E_t-1 from the float32 ring (lag 0 is float64): each element off
        # by at most 2^-24 relative, so cos1 is 1 within 2^-24 (an AMD EPYC gave 1 + 1.3e-9)
        assert m["cos1"] == pytest.approx(1.0, abs=2.0**-24)
        assert m["acc_w"] == pytest.approx(2.0)
        assert m["acc_all"] == pytest.approx(2.0, abs=1e-6)
    for q in ("random_sign", "sr", "sr_gfx950"):
        m = tr[q]["scopes"]["model"]
        assert m["cos1"] < 0.9 and m["acc_w"] < 1.9
    m = tr["none"]["scopes"]["model"]
    assert m["gradient_acc_all"] == pytest.approx(2.0, abs=1e-9)
    assert 0.01 < m["rel_error"] < 0.5 and m["cos_eg"] < 0
    assert 0 < m["adam_rel"] < 1 and 0.5 < m["adam_cos"] <= 1 and m["adam_perp"] <= m["adam_rel"]
    assert len(tr["none"]["scopes"]) == 1 + 14  # the model and its 14 MXLinear layers
    fr = r["fractions"]
    assert set(fr) == {"none", "h16", "random_sign", "sr", "sr_gfx950"}
    assert fr["none"]["wgrad.dy"]["zero_flushed"] > fr["h16"]["wgrad.dy"]["zero_flushed"]
    assert "fprop.x" in fr["h16"] and fr["none"]["wgrad.dy"]["sampled_steps"] == 2


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_capture_in_micro_batches_gives_the_batch_gradients(corpus, bf16_run):
    """The mechanism analysis captures X and dY in the run's micro-batches (the memory of one
    micro-batch's activations, so it fits beside training runs on one GPU): the same X, dY,
    Wgrad and parameter gradients as one forward and backward of the whole batch."""
    from ocpmx.llama_train.data import TokenStream
    from ocpmx.llama_train.gradient_error import capture_with_grads, load_run
    model, tok, c, dist, _ = load_run(bf16_run)
    batch = TokenStream(corpus, tok, 64, seed=5).next_batch(4)
    runs = []
    for micro in (None, 2, 1):
        loss, layers = capture_with_grads(model, batch, dist.device, micro)
        grads = [p.grad.clone() for p in model.parameters()]
        runs.append((loss, layers, grads))
    (l0, lay0, g0) = runs[0]
    for loss, layers, grads in runs[1:]:
        assert loss == pytest.approx(l0, rel=1e-5)
        for (m0, x0, d0), (m, x, d) in zip(lay0, layers):
            assert m is m0 and x.shape == x0.shape and d.shape == d0.shape
            # (bf16 products of different batch shapes round differently: compare as a whole)
            assert _rel(x, x0) < 1e-2 and _rel(d, d0) < 1e-2
            assert _rel(d.double().t() @ x.double(), d0.double().t() @ x0.double()) < 1e-2
        assert max(_rel(a, b) for a, b in zip(grads, g0)) < 1e-2
        # layers fed one input (wq, wk, wv; w1, w3) share one X, as in the whole-batch capture
        groups = lambda lay: sorted(sorted(i for i, (_, x, _) in enumerate(lay)
                                           if x.data_ptr() == p)
                                    for p in {x.data_ptr() for _, x, _ in lay})
        assert groups(layers) == groups(lay0) and len(groups(lay0)) < len(lay0)
    with pytest.raises(ValueError, match="do not divide into micro-batches of 3"):
        capture_with_grads(model, batch, dist.device, 3)


def test_mechanism_analyze_run_writes_the_report(bf16_run, tmp_path):
    r = M.analyze_run(bf16_run, tmp_path, steps=[0], batches=3, max_lag=2, window=3,
                      fractions_every=3, bootstrap=20)
    c = r["checkpoints"]["0"]
    assert c["steps"] == 3 and c["first_step"] == 1 and c["advance"]
    md = (tmp_path / "mechanism.md").read_text()
    assert "Checkpoint after step 0" in md and "random_sign" in md and "wgrad.dy" in md
    assert json.loads((tmp_path / "mechanism.json").read_text())["checkpoints"].keys() == {"0"}

    def png_size(path):  # the figure: one column of panels per checkpoint
        head = path.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")

    one = png_size(tmp_path / "mechanism.png")
    with pytest.raises(FileNotFoundError, match="no checkpoint after step 7"):
        M.analyze_run(bf16_run, tmp_path, steps=[7], batches=2)
    # checkpoints analyzed separately (on the device, each as soon as it exists) merge into one
    # report, in step order; the same checkpoint twice or another run's is refused
    later = tmp_path / "later"
    later.mkdir()
    other = dict(r, checkpoints={"12": dict(c, first_step=13)})
    (later / "mechanism.json").write_text(json.dumps(other))
    merged = M.merge_results([later, tmp_path], tmp_path / "all")
    assert list(merged["checkpoints"]) == ["0", "12"]
    assert merged["checkpoints"]["12"]["first_step"] == 13
    md = (tmp_path / "all" / "mechanism.md").read_text()
    assert md.index("after step 0 ") < md.index("after step 12 ")
    two = png_size(tmp_path / "all" / "mechanism.png")
    assert two[1] == one[1] and abs(two[0] - 2 * one[0]) <= 2
    # each checkpoint names where it came from (a part may be another training of the same
    # arm and seed, on another device): in the json, under its heading, and every device
    assert merged["checkpoints"]["12"]["source"] == {"part": str(later), "run": r["run"],
                                                     "device": r["device"]}
    assert merged["checkpoints"]["0"]["source"]["part"] == str(tmp_path)
    assert merged["device"] == r["device"]
    assert md.count(f"From `{later}`") == 1 and md.count(f"From `{tmp_path}` ") == 1
    (later / "mechanism.json").write_text(json.dumps(dict(other, device="GPU B")))
    mixed = M.merge_results([tmp_path, later], tmp_path / "mixed")
    assert mixed["device"] == f"{r['device']} / GPU B"
    assert mixed["checkpoints"]["12"]["source"]["device"] == "GPU B"
    # a merged report merges again with its sources kept
    again = M.merge_results([tmp_path / "mixed"], tmp_path / "again")
    assert again["checkpoints"] == mixed["checkpoints"] and again["device"] == mixed["device"]
    (later / "mechanism.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="already in an earlier part"):
        M.merge_results([tmp_path, tmp_path], tmp_path / "x")
    (later / "mechanism.json").write_text(json.dumps(
        dict(other, checkpoints={"12": dict(c, window=c["window"] + 1)})))
    with pytest.raises(ValueError, match="analyzed with"):
        M.merge_results([tmp_path, later], tmp_path / "x")
    (later / "mechanism.json").write_text(json.dumps(dict(other, run="elsewhere")))
    with pytest.raises(ValueError, match="run 'elsewhere'"):
        M.merge_results([tmp_path, later], tmp_path / "x")


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("treatment", ["none", "h16", "random_sign", "sr"])
def test_operand_fractions_in_chunks(axis, treatment):
    """``mechanism._fractions`` counts in chunks of rows (the twelfth session's GPU ran out of
    memory on a float64 copy of a whole operand): any chunk size gives the counts of one
    whole-tensor computation written here (zeros planted, so a misaligned dequantized value
    changes the flushed count; random signs, whose matrix is not symmetric, so the rotation's
    direction matters), and a planted block gives its hand count under the
    'even' scale rule (amax 6.5 = 1.625 * 4 rounds to 1.5 * 4 at E2M1's one mantissa bit, so the
    scale is 2^0 and 6.5 saturates past 6; 0.2 is below half the smallest subnormal 0.5 and
    flushes; the ones are exact)."""
    import torch
    from ocpmx.llama_train import mechanism
    from ocpmx.native import GemmContext, dequantize, quantize
    g = mechanism.TREATMENTS[treatment]
    rot = GemmContext(seed=1, layer=0, step=0, micro=0).rotation(g, "wgrad")
    rng = np.random.default_rng(3)
    t = torch.from_numpy(rng.standard_normal((96, 64)) * np.exp2(rng.integers(-6, 7, (96, 64))))
    t[::5, ::3] = 0
    t = t.float()
    seed, j = 99, 0
    q = quantize(t, "e2m1", axis=axis, scale_rule=g.scale_rule, rounding=g.rounding[j],
                 seed=seed, rotation=rot, conversion=g.conversion)
    x = t.double()
    if rot is not None:
        r = torch.from_numpy(rot.matrix())
        m = x.movedim(axis, -1)
        x = (m.reshape(*m.shape[:-1], -1, r.shape[0]) @ r.t()).reshape(m.shape).movedim(-1, axis)
    scale = torch.pow(2.0, q.scales.double() - 127).repeat_interleave(32, dim=axis)
    want = (int((x.abs() > 6.0 * scale).sum()),
            int(((x != 0) & (dequantize(q).double() == 0)).sum()))
    assert want[1] > 0
    for elements in (1, 200, 1000, 1 << 24):  # a row at a time, 2-3 rows, 10-15 rows, whole
        assert mechanism._fractions(t, axis, g, rot, seed, j, elements=elements) == want
    if treatment == "none":
        block = torch.ones(32, 3)
        block[0, 1], block[1, 1] = 6.5, 0.2
        assert mechanism.MX_SCALE_RULE == "even"
        assert mechanism._fractions(block, 0, g, None, seed, j, elements=40) == (1, 1)


def test_deterministic_mode_is_on_inside_training_and_restored(corpus, tmp_path, monkeypatch,
                                                              caplog):
    """``--deterministic``: torch's deterministic algorithms and Inductor's deterministic mode
    hold while the run trains (an MX run on CPU: every op it uses has a deterministic kernel,
    or this would raise), are restored after, and the run gives the bits of the same run
    without the flag (on CPU both are deterministic); recorded in config.json."""
    import os

    import torch._inductor.config as inductor_config
    seen = []
    loss = T.F.cross_entropy

    def spy(*a, **kw):
        seen.append((torch.are_deterministic_algorithms_enabled(), inductor_config.deterministic))
        return loss(*a, **kw)

    monkeypatch.setattr(T.F, "cross_entropy", spy)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    assert not torch.are_deterministic_algorithms_enabled()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # a CPU's threads are not covered: it says so
    try:
        with caplog.at_level("WARNING", logger="ocpmx.llama_train"):
            T.train(cfg(corpus, tmp_path / "d", recipe="mxfp4_all_h16", deterministic=True))
    finally:
        torch.set_num_threads(threads)
    warned = [r.getMessage() for r in caplog.records if "--deterministic on a CPU" in r.getMessage()]
    assert len(warned) == 1 and "OMP_NUM_THREADS=1" in warned[0]
    assert seen and all(s == (True, True) for s in seen)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert not torch.are_deterministic_algorithms_enabled() and not inductor_config.deterministic
    seen.clear()
    T.train(cfg(corpus, tmp_path / "n", recipe="mxfp4_all_h16"))
    assert seen and all(s == (False, False) for s in seen)
    assert json.loads((tmp_path / "d" / "config.json").read_text())["deterministic"] is True
    assert json.loads((tmp_path / "n" / "config.json").read_text())["deterministic"] is False
    d, _ = T.read_metrics(tmp_path / "d" / "metrics.jsonl")
    n, _ = T.read_metrics(tmp_path / "n" / "metrics.jsonl")
    assert [r["loss"] for r in d] == [r["loss"] for r in n]

"""ocpmx train's safety (issue 22): no run overwritten unasked, a killed run resumes exactly,
TOML run files, help for every flag, one-line errors for bad inputs, progress logging, plots."""
import argparse
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys

import pytest
import torch

from ocpmx import cli
from ocpmx.llama_train import plotting
from ocpmx.llama_train import train as T
from ocpmx.llama_train.metrics import Metrics

# the tiny model in bf16: the fastest real run (about 5 s as a process, most of it imports)
ARGS = ["--preset", "tiny", "--recipe", "bf16", "--max-steps", "8", "--batch-size", "2",
        "--seq-len", "32", "--warmup-steps", "2", "--eval-every", "2", "--eval-sequences", "2",
        "--save-every", "4", "--device", "cpu", "--no-progress", "--no-tensorboard"]


def _train(corpus, out, *extra):
    return cli.main(["train", *ARGS, "--data", str(corpus), "--out", str(out), *extra])


def _one_line_error(capsys, *words):
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err and "error" in err, err
    for w in words:
        assert w in err, err
    return err


def test_existing_run_needs_resume_or_overwrite(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(corpus, out, "--max-steps", "3", "--save-every", "1") == 0
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()  # the run's progress lines
    before = (out / "metrics.jsonl").read_text()
    assert _train(corpus, out, "--max-steps", "2") == 2
    _one_line_error(capsys, str(out), "--resume", "--overwrite")
    assert (out / "metrics.jsonl").read_text() == before  # nothing touched
    assert _train(corpus, out, "--resume", "--overwrite") == 2
    _one_line_error(capsys, "--resume", "--overwrite")
    assert _train(corpus, out, "--max-steps", "2", "--save-every", "0", "--overwrite") == 0
    rows, _ = T.read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    assert not (out / "checkpoints").exists()  # the old run's checkpoints were removed
    assert (out / "notes.txt").read_text() == "mine"  # files that are not run outputs stay


def _digest(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def _killed_run(corpus, out, point, *extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", OCPMX_TEST_CRASH=point)
    done = subprocess.run([sys.executable, "-m", "ocpmx.cli", "train", *ARGS, "--data",
                           str(corpus), "--out", str(out), *extra],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]


def test_killed_run_resumes_exactly(corpus, tmp_path):
    """A real ocpmx train process SIGKILLs itself half-way through a metrics line (step 5),
    then, resumed, just before renaming its step-7 checkpoint into place; the last good
    checkpoint stays intact, metrics.jsonl ends with neither torn nor repeated lines, and the
    losses and checkpoints equal an uninterrupted run's bit for bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the processes (OMP_NUM_THREADS=1): the same sums
    try:
        assert _train(corpus, tmp_path / "ref") == 0
        ck = tmp_path / "cut" / "checkpoints"
        _killed_run(corpus, tmp_path / "cut", "metrics-append@5")
        text = (tmp_path / "cut" / "metrics.jsonl").read_text()
        assert not text.endswith("\n")  # the kill tore the step-5 row
        assert (ck / "latest").read_text() == "step_00000003"
        good = _digest(ck / "step_00000003")
        _killed_run(corpus, tmp_path / "cut", "checkpoint-before-rename@7", "--resume")
        assert (ck / "latest").read_text() == "step_00000003"
        assert (ck / ".tmp_step_00000007").is_dir() and not (ck / "step_00000007").exists()
        assert _digest(ck / "step_00000003") == good
        assert _train(corpus, tmp_path / "cut", "--resume") == 0
    finally:
        torch.set_num_threads(threads)
    lines = (tmp_path / "cut" / "metrics.jsonl").read_text().split("\n")
    assert lines[-1] == ""
    rows = [json.loads(line) for line in lines[:-1]]  # every line whole
    train_rows = [r for r in rows if "loss" in r]
    val_rows = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in train_rows] == list(range(8))
    assert [r["step"] for r in val_rows] == [1, 3, 5, 7]
    ref, ref_val = T.read_metrics(tmp_path / "ref" / "metrics.jsonl")
    for key in ("loss", "grad_norm", "lr", "tokens"):
        assert [r[key] for r in train_rows] == [r[key] for r in ref]
    assert [r["val_loss"] for r in val_rows] == [r["val_loss"] for r in ref_val]
    assert (ck / "latest").read_text() == "step_00000007"
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step_00000003", "step_00000007"]
    ref_ck = tmp_path / "ref" / "checkpoints"
    for step in ("step_00000003", "step_00000007"):
        for name in ("model.safetensors", "optimizer.safetensors"):
            assert (ck / step / name).read_bytes() == (ref_ck / step / name).read_bytes()


def test_toml_run_file(tmp_path, monkeypatch, capsys):
    """--config run.toml in TrainConfig's sections; --train-preset < file < command line;
    unknown sections and keys and ill-typed values are one-line errors."""
    seen = []
    monkeypatch.setattr(T, "train", lambda c, resume=False, overwrite=False:
                        seen.append((c, resume, overwrite)) or {"tokens": 0})
    monkeypatch.setattr(T, "read_metrics", lambda p: ([{"loss": 0.0}], []))
    run = tmp_path / "run.toml"
    run.write_text('[model]\npreset = "30m"\n[training]\nmax_steps = 7\nseed = 3\n'
                   '[optimizer]\nlr = 1\nbetas = [0.9, 0.99]\n[logging]\nout = "o"\n'
                   '[checkpoint]\nkeep_steps = [10, 20]\n[data]\nseq_len = 4096\n')
    assert cli.main(["train", "--config", str(run), "--seed", "5", "--overwrite"]) == 0
    assert cli.main(["train", "--train-preset", "mlperf", "--config", str(run)]) == 0
    (c, resume, overwrite), (m, _, _) = seen
    assert (c.model.preset, c.training.max_steps, c.training.seed, c.optimizer.lr,
            c.optimizer.betas, c.logging.out, c.checkpoint.keep_steps, overwrite, resume) == \
        ("30m", 7, 5, 1.0, (0.9, 0.99), "o", [10, 20], True, False)
    assert (m.model.preset, m.data.seq_len, m.data.grad_accum) == ("30m", 4096, 32)
    for body, words in (('[training]\nmax_step = 7\n', ["training.max_step"]),
                        ('[trainer]\nmax_steps = 7\n[optim]\nlr = 1\n', ["trainer", "optim"]),
                        ('[training]\nmax_steps = "7"\n', ["training.max_steps", "int"]),
                        ('[training]\nnan_policy = "halt"\n', ["'stop' or 'skip'"]),
                        ('[training\n', [str(run)]),
                        ('[training]\nmax_steps = 7\n', ["--out"])):
        run.write_text(body)
        assert cli.main(["train", "--config", str(run)]) == 2
        _one_line_error(capsys, *words)
    assert cli.main(["train", "--config", str(tmp_path / "none.toml"), "--out", "o"]) == 2
    _one_line_error(capsys, "none.toml")


def _subparsers():
    p = cli.build_parser()
    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    return {n: sub.choices[n] for n in ("data", "train", "plot", "scale-report", "ablate")}


def test_every_flag_has_help_with_default_and_choices():
    for name, parser in _subparsers().items():
        fmt = parser._get_formatter()
        for a in parser._actions:
            if isinstance(a, argparse._HelpAction):
                continue
            text = " ".join(fmt._expand_help(a).split()) if a.help else ""
            where = f"ocpmx {name} {a.option_strings or a.dest}"
            assert len(text) > 10, f"{where}: no help"
            if a.option_strings and not a.required and not (name == "train" and a.dest == "out"):
                assert "default" in text, f"{where}: no default in {text!r}"
            for c in a.choices or ():
                assert str(c) in text, f"{where}: choice {c} not in {text!r}"


def test_tokenize_reuse_cache_keeps_only_a_matching_cache(corpus, tmp_path, capsys):
    """--reuse-cache keeps a split's cache that matches its shards and the tokenizer, and
    tokenizes again when the shards changed; without it, tokenize always writes."""
    import shutil
    d = tmp_path / "c"
    shutil.copytree(corpus, d, ignore=shutil.ignore_patterns("*.tokens.*"))
    npy = d / "c4-train.tokens.npy"
    assert cli.main(["data", "tokenize", "--out", str(d)]) == 0
    stamp = npy.stat().st_mtime_ns
    assert cli.main(["data", "tokenize", "--reuse-cache", "--out", str(d)]) == 0
    assert npy.stat().st_mtime_ns == stamp and "kept" in capsys.readouterr().out
    assert cli.main(["data", "tokenize", "--out", str(d)]) == 0
    assert npy.stat().st_mtime_ns != stamp
    stamp = npy.stat().st_mtime_ns
    last = sorted(d.glob("c4-train.*.json.gz"))[-1]
    last.rename(d / "unused.json.gz")  # the shards changed: the cache no longer matches
    assert cli.main(["data", "tokenize", "--reuse-cache", "--out", str(d)]) == 0
    assert npy.stat().st_mtime_ns != stamp


def test_bad_inputs_are_one_line_errors(corpus, tmp_path, capsys):
    assert cli.main(["data", "tokenize", "--out", str(tmp_path / "nowhere")]) == 2
    _one_line_error(capsys, "nowhere", "does not exist")
    assert cli.main(["ablate", "analyze", "--plan", "v1", "--micro-batch", "8"]) == 2
    _one_line_error(capsys, "not of --plan v1")
    assert cli.main(["ablate", "analyze", "--plan", "v2", "--out", str(tmp_path / "m"),
                     "--merge", str(tmp_path / "nopart")]) == 2
    _one_line_error(capsys, "nopart", "no mechanism.json")
    assert cli.main(["plot", str(tmp_path / "norun"), "-o", str(tmp_path / "x.png")]) == 2
    _one_line_error(capsys, "norun")
    assert cli.main(["scale-report", "--runs", str(tmp_path / "noruns")]) == 2
    _one_line_error(capsys, "noruns")
    assert cli.main(["train", "--out", str(tmp_path / "r"), "--data",
                     str(tmp_path / "nodata")]) == 2
    _one_line_error(capsys, "nodata", "does not exist")
    assert not (tmp_path / "r").exists()
    (tmp_path / "file").write_text("")
    assert _train(corpus, tmp_path / "file" / "run") == 2
    _one_line_error(capsys, "--out", "file")
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        assert _train(corpus, ro / "run") == 2
        _one_line_error(capsys, "--out", "permission")
    # a base install: torch cannot be imported; the parser is built and the check runs
    code = ("import sys; sys.modules['torch'] = None; from ocpmx import cli; "
            f"sys.exit(cli.main(['train', '--out', {str(tmp_path / 'r')!r}, '--data', "
            f"{str(corpus)!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    err = done.stderr.strip()
    assert done.returncode == 2 and "\n" not in err and "Traceback" not in err, err
    assert "torch" in err and "pip install" in err and "[train]" in err


def test_progress_lines_and_bar(corpus, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="ocpmx.llama_train")
    T.train(T.TrainConfig.from_flat(preset="tiny", recipe="bf16", data=str(corpus),
                                    out=str(tmp_path / "r"), max_steps=5, batch_size=2,
                                    seq_len=32, eval_every=4, eval_sequences=2, save_every=0,
                                    progress=False, tensorboard=False, log_every=2))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    steps = [line.split()[1] for line in lines if "ETA" in line]
    assert steps == ["2/5", "4/5", "5/5"]  # every 2 steps and after the last, without a bar
    for word in ("loss", "lr", "tokens/s", "ETA"):
        assert word in lines[0]
    assert any("validation loss" in line for line in lines)
    m = Metrics(tmp_path / "r", resume_step=4, tensorboard=False, steps=(5, 7), progress=True)
    row = dict(step=5, tokens=10, loss=2.5, lr=3e-4, grad_norm=1.0, tokens_per_s=9.0, mfu=0.1)
    m.log_step(row)
    m.log_eval(5, 10, 2.25)
    assert "lr=3.00e-04" in m.bar.postfix and "val=2.250" in m.bar.postfix
    m.close()


def _fake_run(d, recipe, seed, losses, val):
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"recipe": recipe, "seed": seed, "out": str(d)}))
    rows = [{"step": i, "tokens": 1000 * (i + 1), "loss": v, "lr": 1e-3}
            for i, v in enumerate(losses)]
    rows += [{"step": s, "tokens": 1000 * (s + 1), **v} for s, v in val]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_plot_labels_bands_markers_annotations(tmp_path):
    """Two seeds of arm a: a mean line with the seed range shaded; arm b, one run with one
    validation point, still shows it (a marker); units on the axes; an annotated spike."""
    _fake_run(tmp_path / "a" / "seed0", "x", 0, [5, 4, 3, 2.5], [(3, {"val_loss": 2.6})])
    _fake_run(tmp_path / "a" / "seed1", "x", 1, [5, 4.2, 3.2, 2.7], [(3, {"val_loss": 2.8})])
    _fake_run(tmp_path / "b", "y", 0, [5, 4.5, 3.5, 3.0],
              [(3, {"val_loss": 3.1, "val_loss_recipe": 3.3})])
    runs = [str(tmp_path / "a" / "seed0"), str(tmp_path / "a" / "seed1"), str(tmp_path / "b")]
    fig = plotting.loss_figure(runs, annotate=[(2500, "spike: a bad shard")])
    tr, va = fig.axes
    for ax in (tr, va):
        assert ax.get_xlabel() == "tokens" and "nats" in ax.get_ylabel()
    assert {"a (2 seeds)", "b"} <= {t.get_text() for t in tr.get_legend().get_texts()}
    assert len(tr.collections) == 1  # the band of arm a (b has one seed)
    assert list(tr.get_lines()[0].get_ydata()) == pytest.approx([5, 4.1, 3.1, 2.6])
    val_lines = [l for l in va.get_lines() if l.get_marker() in ("o", "x")]
    assert sorted(len(l.get_xdata()) for l in val_lines) == [1, 1, 1]  # a; b; b's recipe
    assert "spike: a bad shard" in [t.get_text() for t in tr.texts]
    import matplotlib.pyplot as plt
    plt.close(fig)
    _fake_run(tmp_path / "c", "y", 0, [5], [])  # b's configuration and seed: not a band
    assert [len(m) for _, m in plotting.group_runs([*runs, str(tmp_path / "c")])] == [2, 1, 1]
    # an option added after a run was written counts as its default there: runs from before
    # and after `deterministic` existed are one arm while it is off, two once it is on
    _fake_run(tmp_path / "d" / "seed2", "x", 2, [5], [])
    cfg = json.loads((tmp_path / "d" / "seed2" / "config.json").read_text())
    (tmp_path / "d" / "seed2" / "config.json").write_text(json.dumps({**cfg,
                                                                      "deterministic": False}))
    both = [*runs[:2], str(tmp_path / "d" / "seed2")]
    assert [len(m) for _, m in plotting.group_runs(both)] == [3]
    (tmp_path / "d" / "seed2" / "config.json").write_text(json.dumps({**cfg,
                                                                      "deterministic": True}))
    assert [len(m) for _, m in plotting.group_runs(both)] == [2, 1]
    png = tmp_path / "loss.png"
    assert cli.main(["plot", *runs, "-o", str(png), "--annotate", "2500:spike"]) == 0
    assert png.stat().st_size > 1000

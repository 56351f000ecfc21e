"""``ocpmx data``, ``ocpmx train`` and ``ocpmx plot``."""
from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
import typing
from dataclasses import MISSING
from pathlib import Path

from ..cli import _positive_int

# OSErrors of a user's input (a missing directory, an unwritable --out, a run in the way): one
# line and exit status 2, not a traceback
_INPUT_ERRORS = (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError,
                 PermissionError)


class MissingExtra(ImportError):
    pass


def _one_line_errors(cmd):
    """``ocpmx <command>: error: <message>`` and exit status 2 for a bad input, a missing
    optional package or a bad configuration (the last also caught by ocpmx.cli.main)."""
    @functools.wraps(cmd)
    def run(args) -> int:
        try:
            return cmd(args)
        except (*_INPUT_ERRORS, MissingExtra, ValueError, TypeError) as e:
            print(f"ocpmx {args.command}: error: {e}", file=sys.stderr)
            return 2
    return run


def require(*modules: str, extra: str = "train") -> None:
    """MissingExtra naming the extra to install when any of ``modules`` cannot be imported
    (a base install: ``pip install ocpmx`` without ``[train]``)."""
    missing = []
    for m in modules:
        try:
            importlib.import_module(m)
        except ImportError:
            missing.append(m)
    if missing:
        raise MissingExtra(f"{', '.join(missing)} not installed: this command needs the "
                           f"{extra} extra (pip install -e '.[{extra}]')")


def add_parsers(sub) -> None:
    d = sub.add_parser("data", help="build an offline C4-layout corpus and its tokenizer")
    d.add_argument("action", choices=["build-corpus", "tokenizer", "tokenize"],
                   help="build-corpus: shards and tokenizer; tokenizer: train the BPE on existing "
                        "shards; tokenize: pre-tokenize the shards once (c4-*.tokens.npy), which "
                        "training then reads instead of tokenizing on the fly")
    d.add_argument("--out", default="data/c4-mini",
                   help="corpus directory (default: %(default)s)")
    d.add_argument("--reuse-cache", action="store_true",
                   help="tokenize: keep a split's cache that already matches its shards and the "
                        "tokenizer (the test training applies before reading it) (default: "
                        "tokenize again)")
    d.add_argument("--source", default="stdlib", choices=["stdlib", "debian", "debian-xl"],
                   help="stdlib: Python's docstrings (any machine); debian: Debian documentation "
                        "packages via apt-get download (linux-doc, python3.11-doc); debian-xl: "
                        "the ablation's corpora, v2 or v3 (RFCs, manuals, dictionaries, source "
                        "comments; llama_train/corpus_xl.py), with MANIFEST.json (default: "
                        "stdlib)")
    d.add_argument("--packages", default="default", choices=["default", "large", "v2", "v3"],
                   help="Debian package set: default (34 M characters) or large (93 M, for "
                        "the v1 ablation); debian-xl: v2 (its default; the ablation's 344.5 M "
                        "tokens) or v3 (v2 and some 13,000 more packages: results/ablation_v2/"
                        "CORPUS.md) (default: default)")
    d.add_argument("--manifest", default=None,
                   help="debian-xl: a previous build's MANIFEST.json (or .json.gz); the same "
                        "package versions are downloaded and their .deb SHA-256 checked "
                        "(default: none)")
    d.add_argument("--workdir", default=None,
                   help="debian-xl: where downloads are kept (reused by a later build; "
                        "default: a temporary directory)")
    d.add_argument("--train-shards", type=int, default=None,
                   help="training shards (default 4; debian-xl 32)")
    d.add_argument("--val-fraction", type=float, default=None,
                   help="documents held out for validation (default 0.05; debian-xl 0.01)")
    d.add_argument("--tokenizer-chars", type=int, default=None,
                   help="train the BPE on the first N characters of the training shards "
                        "(default: all)")
    d.add_argument("--vocab-size", type=int, default=512,
                   help="BPE vocabulary (512 for tiny; 32768 for the 30m/125m presets; "
                        "default: %(default)s)")
    d.set_defaults(func=cmd_data)

    t = sub.add_parser("train", help="Llama 3.1 pretraining with a precision recipe",
                       description="Llama 3.1 pretraining with a precision recipe. Values come "
                                   "from the fields' defaults, then --train-preset, then "
                                   "--config's file, then the options on the command line.")
    from .config import TRAIN_PRESETS, section_types
    t.add_argument("--config", metavar="RUN.toml",
                   help="a TOML file with the options in sections as below ("
                        + ", ".join(f"[{s}]" for s in section_types()) + "; keys are the "
                        "option names with _ for -, e.g. [training] max_steps = 100); options "
                        "on the command line override it (default: none)")
    t.add_argument("--resume", action="store_true",
                   help="continue the run in OUT from OUT/checkpoints/latest (bit-exactly); "
                        "metrics.jsonl keeps its rows up to that checkpoint (default: off)")
    t.add_argument("--overwrite", action="store_true",
                   help="OUT holds a run (metrics.jsonl, checkpoints/): remove its outputs and "
                        "start afresh (without --resume or --overwrite such a directory is an "
                        "error; default: off)")
    t.add_argument("--train-preset", choices=sorted(TRAIN_PRESETS),
                   help="hyper-parameters from a named set (one of "
                        f"{', '.join(sorted(TRAIN_PRESETS))}; mlperf: the MLPerf Llama 3.1 8B "
                        "settings; default: none)")
    add_config_flags(t)
    t.set_defaults(func=cmd_train)

    a = sub.add_parser("ablate", help="the study's ablation: run arms x seeds on the GPUs, "
                       "summarize them, analyze the Wgrad error")
    a.add_argument("action", choices=["run", "summarize", "analyze"],
                   help="run: train the plan's arms x seeds (resuming cut-off runs); "
                        "summarize: the table of the finished runs; analyze: the Wgrad error "
                        "analysis of a run's checkpoints")
    a.add_argument("--plan", default="v1", choices=["v1", "v2", "v2-125m"],
                   help="v1: results/ablation's 10 arms (100 M tokens); v2: results/ablation_v2/"
                        "PLAN.md (Wgrad-only arms, 3 paired seeds each, 250 M tokens, both "
                        "evaluation fields, the plan's endpoints; analyze: the redone mechanism "
                        "analysis at the 25/50/100%% checkpoints); v2-125m: v2's next stage, "
                        "its three Wgrad arms at 125m (PLAN.md, Stage 2) (default: v1)")
    a.add_argument("--out", default="runs/ablation",
                   help="ablation directory (run dirs, table) (default: %(default)s)")
    a.add_argument("--data", default=None,
                   help="corpus directory (run: default data/debl for v1, data/xl for v2; "
                        "analyze: default the run's own)")
    a.add_argument("--arms", default=None, help="comma-separated recipes (default: the plan's)")
    a.add_argument("--seeds", default=None,
                   help="seeds (default 0,1,2); v1: the first for every arm, the others for "
                        "bf16, mxfp4_all, mxfp4_all_h16; v2: every seed for every arm")
    a.add_argument("--stop-after", type=float, default=None,
                   help="run: seconds after which the batch stops (running runs are stopped and "
                        "resume at the next call): for device calls of limited length "
                        "(default: none)")
    a.add_argument("--gpus", default=None,
                   help="comma-separated GPU ids (default: all visible; none: one CPU slot)")
    a.add_argument("--per-gpu", type=int, default=1,
                   help="runs at a time on each GPU (default: %(default)s)")
    a.add_argument("--train-args", default=None,
                   help="options for every ocpmx train run, quoted (default: the plan's: v1 the "
                        "30m, 100 M-token settings of results/ablation; v2 PLAN.md's)")
    a.add_argument("--run", default=None,
                   help="analyze: the run whose checkpoints to use (default: v1 OUT/bf16/seed0, "
                        "v2 OUT/bf16/seed2)")
    a.add_argument("--batches", type=int, default=None,
                   help="analyze: consecutive batches (v1 default 8; v2 default 128)")
    a.add_argument("--batch-size", type=int, default=None,
                   help="analyze: sequences per batch (v1 default 16; v2 default the run's "
                        "sequences per optimizer step)")
    a.add_argument("--checkpoints", default=None,
                   help="analyze v2: comma-separated checkpoint steps (default: every kept "
                        "checkpoint of the run)")
    a.add_argument("--micro-batch", type=_positive_int, default=None,
                   help="analyze v2: sequences per forward and backward (default: the run's "
                        "micro-batch; fewer take less GPU memory, same gradients)")
    a.add_argument("--merge", default=None, metavar="DIR,DIR",
                   help="analyze v2: instead of analyzing, combine the mechanism.json of "
                        "analyses of one run's checkpoints made separately into OUT "
                        "(default: none, analyze)")
    a.add_argument("--against", default=None, metavar="DIR",
                   help="summarize v2: another stage's folder (the 30m block's, for the 125m "
                        "stage): each endpoint's mean there and the ratio here / there "
                        "(PLAN.md, Stage 2; no verdict of its own) (default: none)")
    a.add_argument("--bootstrap", type=int, default=1000,
                   help="analyze v2: bootstrap resamples for the 95%% intervals "
                        "(default: %(default)s)")
    a.set_defaults(func=cmd_ablate)

    p = sub.add_parser("plot", help="train/validation loss against tokens for run directories",
                       description="Train and validation loss (nats per token) against tokens. "
                                   "Runs whose config.json differ only in the seed are one arm: "
                                   "its mean, with the seeds' spread shaded.")
    p.add_argument("runs", nargs="+", metavar="RUN",
                   help="run directories (each with a metrics.jsonl)")
    p.add_argument("-o", "--out", default="loss.png",
                   help="the image to write (PNG, or any format by its suffix; default: "
                        "%(default)s)")
    p.add_argument("--annotate", action="append", default=[], metavar="TOKENS:TEXT",
                   type=_annotation,
                   help="mark an explained event at TOKENS (e.g. 1.2e9:'loss spike: bad "
                        "shard'); repeatable (default: none)")
    p.set_defaults(func=cmd_plot)

    r = sub.add_parser("scale-report", help="throughput table of multi-GPU runs (one directory "
                                            "per run under --runs): tokens/s/GPU, MFU, memory, "
                                            "step breakdown, loss")
    r.add_argument("--runs", required=True, help="folder holding the run directories")
    r.add_argument("--out", default=None,
                   help="where scale.md/json and loss.png go (default: --runs)")
    r.add_argument("--warmup", type=int, default=10,
                   help="steps left out of the timing (default: %(default)s)")
    r.set_defaults(func=cmd_scale_report)


def _annotation(text: str) -> tuple[float, str]:
    """TOKENS:TEXT -> (tokens, text) for ``plot --annotate``."""
    at, sep, label = text.partition(":")
    try:
        return float(at), label if sep else ""
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TOKENS:TEXT, got {text!r}") from None


@_one_line_errors
def cmd_data(args) -> int:
    require("torch", "tokenizers")
    from .corpus import build_corpus
    from .data import load_cache, load_tokenizer, tokenize_split, train_tokenizer
    if args.action != "build-corpus" and not Path(args.out).is_dir():
        raise FileNotFoundError(f"corpus directory {args.out} does not exist (ocpmx data "
                                f"build-corpus --out {args.out} builds one)")
    if args.action == "tokenize":
        tok = load_tokenizer(Path(args.out) / "tokenizer.json")
        for split in ("train", "validation"):
            npy = Path(args.out) / f"c4-{split}.tokens.npy"
            if args.reuse_cache and load_cache(args.out, tok, split) is not None:
                print(f"{split}: {npy} matches the shards and the tokenizer: kept")
                continue
            meta = tokenize_split(args.out, tok, split)
            print(f"{split}: {meta['tokens']:,} tokens ({meta['dtype']}) in {npy}")
        return 0
    if args.action == "build-corpus":
        kw = {}
        if args.train_shards is not None:
            kw["n_train_shards"] = args.train_shards
        if args.val_fraction is not None:
            kw["val_fraction"] = args.val_fraction
        if args.source == "debian-xl":
            if args.manifest:
                from .corpus_xl import read_manifest
                kw["manifest"] = read_manifest(args.manifest)
            kw["workdir"] = args.workdir
        elif args.manifest or args.workdir:
            print("--manifest and --workdir apply to --source debian-xl only", file=sys.stderr)
            return 2
        info = build_corpus(args.out, args.source, packages=args.packages, **kw)
        print(json.dumps({k: v for k, v in info.items() if k not in ("packages", "shards")}))
    tok = train_tokenizer(args.out, Path(args.out) / "tokenizer.json", args.vocab_size,
                          max_chars=args.tokenizer_chars)
    print(f"tokenizer: {Path(args.out) / 'tokenizer.json'} ({tok.get_vocab_size()} tokens)")
    return 0


def add_config_flags(parser) -> None:
    """One flag per TrainConfig field (``--max-steps`` for max_steps), one group per section,
    from the fields' types and help texts. Every default is None: a flag not given leaves the
    value to --train-preset or to the field's default."""
    from .config import section_fields, section_types
    groups = {s: parser.add_argument_group(s, t.__doc__) for s, t in section_types().items()}
    for section, f, hint in section_fields():
        kw = {"default": None, **_flag_kind(hint)}
        notes = [f"one of {', '.join(kw['choices'])}"] if "choices" in kw else []
        if f.name == "out":
            notes.append("required, here or as [logging] out in --config")
        else:
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            shown = " ".join(map(str, default)) if isinstance(default, (tuple, list)) else default
            notes.append(f"default: {shown}")
        text = f.metadata["help"] + (f" ({'; '.join(notes)})" if notes else "")
        kw["help"] = text.replace("%", "%%")  # argparse formats help texts with %
        flags = ["--" + f.name.replace("_", "-"), *f.metadata.get("aliases", ())]
        groups[section].add_argument(*flags, **kw)


def _flag_kind(hint) -> dict:
    """argparse options for a field's type: choices for a Literal, --x / --no-x for a bool,
    nargs for a tuple or a list, otherwise the type (int, float, str; Optional[...] alike)."""
    from .config import choices, optional_inner
    allowed = [c for c in choices(hint) if c is not None]
    base = optional_inner(hint) or hint
    args = typing.get_args(base)
    if allowed:
        return {"choices": allowed}
    if base is bool:
        return {"action": argparse.BooleanOptionalAction}
    if typing.get_origin(base) is tuple:
        return {"type": args[0], "nargs": len(args)}
    if typing.get_origin(base) is list:
        return {"type": args[0], "nargs": "*"}
    return {"type": base}


def train_config(args):
    """The TrainConfig of ``ocpmx train``'s arguments: the fields' defaults, overridden by
    --train-preset, then by --config's TOML file, then by the options given."""
    from .config import TRAIN_PRESETS, TrainConfig, load_toml, section_fields
    kw = dict(TRAIN_PRESETS.get(args.train_preset, {})) if args.train_preset else {}
    if args.config:
        if not Path(args.config).is_file():
            raise FileNotFoundError(f"--config {args.config} does not exist")
        kw.update(load_toml(args.config))
    for _, f, _ in section_fields():  # options given on the command line override the rest
        v = getattr(args, f.name)
        if v is not None:
            kw[f.name] = tuple(v) if isinstance(f.default, tuple) else v
    if not kw.get("out"):
        raise ValueError("the run directory is missing: give --out or [logging] out in --config")
    return TrainConfig.from_flat(**kw)


@_one_line_errors
def cmd_train(args) -> int:
    cfg = train_config(args)
    require("torch", "tokenizers", "safetensors")  # before any import of them
    from .metrics import setup_logging, stacks_on_signal
    from .train import TrainingDiverged, train
    setup_logging()
    stacks_on_signal()
    try:
        result = train(cfg, resume=args.resume, overwrite=args.overwrite)
    except TrainingDiverged as e:
        print(f"ocpmx train: {e}", file=sys.stderr)
        return 3
    import os
    if os.environ.get("RANK", "0") == "0":
        from .train import read_metrics
        train_rows, val_rows = read_metrics(Path(cfg.logging.out) / "metrics.jsonl")
        print(f"steps {len(train_rows)}  tokens {result['tokens']}  first loss "
              f"{train_rows[0]['loss']:.4f}  last loss {train_rows[-1]['loss']:.4f}  "
              f"val loss {val_rows[-1]['val_loss']:.4f}" if val_rows else "")
        if result.get("tokens_to_target"):
            print(f"target reached after {result['tokens_to_target']} tokens")
    if result.get("world", 1) > 1:
        _exit_finished_rank()
    return 0


def _exit_finished_rank() -> None:
    """End a torchrun rank whose run has finished on every rank (train() returned: checkpoints
    and metrics written and fsynced, the process group destroyed after a barrier) without the
    interpreter's teardown. On the 2-core CI machine a CPU rank aborted there three times in
    ~45 runs (SIGABRT, 'terminate called without an active exception': a native thread of the
    communication or threading runtimes destroyed while still joinable), which made torchrun
    report a finished run as failed; there is nothing left for the teardown to do."""
    import logging
    import os
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(0)


@_one_line_errors
def cmd_ablate(args) -> int:
    import shlex
    from . import ablation
    plan = ablation.PLANS[args.plan]
    if args.action == "run":
        arms = args.arms.split(",") if args.arms else plan["arms"]
        seeds = [int(x) for x in (args.seeds or "0,1,2").split(",")]
        if args.gpus is None:
            import torch
            gpus = [str(i) for i in range(torch.cuda.device_count())]
        else:
            gpus = [g for g in args.gpus.split(",") if g and g != "none"]
        train_args = shlex.split(args.train_args) if args.train_args else plan["train_args"]
        data = args.data or ("data/debl" if args.plan == "v1" else "data/xl")
        res = ablation.run_ablation(args.out, plan["plan"](arms, seeds), data, gpus,
                                    args.per_gpu, train_args, extra_args=plan["extra_args"],
                                    stop_after=args.stop_after)
        bad = {k: v for k, v in res.items() if v != "done"}
        print(f"{len(res) - len(bad)} of {len(res)} runs done" +
              "".join(f"\n  {k}: {v}" for k, v in bad.items()))
        if any(v == "stopped" for v in res.values()):
            return 4  # stopped by --stop-after: call again to continue
        return 0 if all(v in ("done", "diverged") for v in res.values()) else 1
    if args.action == "summarize":
        if args.plan != "v1":
            if args.against is not None and not Path(args.against).is_dir():
                raise FileNotFoundError(f"--against {args.against} does not exist")
            print(ablation.v2_markdown(ablation.summarize_v2(args.out, against=args.against)))
            return 0
        if args.against is not None:
            raise ValueError("--against is an option of the v2 plans' summarize, not of "
                             "--plan v1")
        table = ablation.summarize(args.out)
        print(ablation.table_markdown(table))
        return 0
    if args.plan != "v1":
        arm, seed = ablation.V2_MECHANISM_RUN
        run = args.run or str(Path(args.out) / arm / f"seed{seed}")
        from .mechanism import analyze_run, markdown as mech_markdown, merge_results
        if args.merge:
            print(mech_markdown(merge_results(args.merge.split(","), args.out)))
            return 0
        steps = [int(x) for x in args.checkpoints.split(",")] if args.checkpoints else None
        res = analyze_run(run, args.out, steps=steps, batches=args.batches or 128,
                          batch_size=args.batch_size, data=args.data,
                          bootstrap=args.bootstrap, micro=args.micro_batch)
        print(mech_markdown(res))
        return 0
    if args.merge or args.micro_batch or args.checkpoints:
        raise ValueError("--merge, --micro-batch and --checkpoints are options of the v2 "
                         "mechanism analysis, not of --plan v1")
    from .gradient_error import analyze, markdown
    run = args.run or str(Path(args.out) / "bf16" / "seed0")
    res = analyze(run, args.out, args.batches or 8, args.batch_size or 16, data=args.data)
    print(markdown(res))
    return 0


@_one_line_errors
def cmd_scale_report(args) -> int:
    require("matplotlib")
    if not Path(args.runs).is_dir():
        raise FileNotFoundError(f"--runs {args.runs} does not exist")
    from .scale_report import markdown, summarize
    rows = summarize(args.runs, args.out, args.warmup)
    print(markdown(rows, args.warmup))
    return 0 if rows else 1


@_one_line_errors
def cmd_plot(args) -> int:
    require("matplotlib")
    from .plotting import plot
    print(plot(args.runs, args.out, annotate=args.annotate))
    return 0

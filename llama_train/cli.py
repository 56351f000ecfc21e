"""``ocpmx data``, ``ocpmx train`` and ``ocpmx plot``."""
from __future__ import annotations

import json
import sys
from dataclasses import fields
from pathlib import Path


def add_parsers(sub) -> None:
    d = sub.add_parser("data", help="build an offline C4-layout corpus and its tokenizer")
    d.add_argument("action", choices=["build-corpus", "tokenizer", "tokenize"],
                   help="build-corpus: shards and tokenizer; tokenizer: train the BPE on existing "
                        "shards; tokenize: pre-tokenize the shards once (c4-*.tokens.npy), which "
                        "training then reads instead of tokenizing on the fly")
    d.add_argument("--out", default="data/c4-mini", help="corpus directory")
    d.add_argument("--source", default="stdlib", choices=["stdlib", "debian"],
                   help="stdlib: Python's docstrings (any machine); debian: Debian documentation "
                        "packages via apt-get download (linux-doc, python3.11-doc)")
    d.add_argument("--packages", default="default", choices=["default", "large"],
                   help="Debian package set: default (34 M characters) or large (93 M, for "
                        "the ablations)")
    d.add_argument("--vocab-size", type=int, default=512,
                   help="BPE vocabulary (512 for tiny; 32768 for the 30m/125m presets)")
    d.set_defaults(func=cmd_data)

    t = sub.add_parser("train", help="Llama 3.1 pretraining with a precision recipe")
    from .config import TRAIN_PRESETS, TrainConfig
    t.add_argument("--preset", default=None,
                   help="model size: 8b, 125m, 30m, tiny (default tiny, or the train preset's)")
    t.add_argument("--recipe", default="bf16")
    t.add_argument("--max-steps", type=int, default=100)
    t.add_argument("--out", required=True)
    t.add_argument("--resume", action="store_true")
    t.add_argument("--data", default="data/c4-mini")
    t.add_argument("--train-preset", choices=sorted(TRAIN_PRESETS),
                   help="hyper-parameters from a named set (mlperf)")
    skip = {"preset", "recipe", "max_steps", "out", "data", "keep_bf16", "betas", "progress"}
    for f in fields(TrainConfig):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            t.add_argument(flag, action="store_true", default=None)
        else:
            kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], None)
            t.add_argument(flag, type=kind or str, default=None)
    t.add_argument("--no-progress", action="store_true")
    t.set_defaults(func=cmd_train)

    a = sub.add_parser("ablate", help="the study's ablation: run arms x seeds on the GPUs, "
                       "summarize them, analyze the Wgrad error")
    a.add_argument("action", choices=["run", "summarize", "analyze"])
    a.add_argument("--out", default="runs/ablation", help="ablation directory (run dirs, table)")
    a.add_argument("--data", default="data/debl")
    a.add_argument("--arms", default=None, help="comma-separated recipes (default: all 10 arms)")
    a.add_argument("--seeds", default="0,1,2",
                   help="seeds; the first for every arm, the others for bf16, mxfp4_all, "
                        "mxfp4_all_h16")
    a.add_argument("--gpus", default=None,
                   help="comma-separated GPU ids (default: all visible; none: one CPU slot)")
    a.add_argument("--per-gpu", type=int, default=1, help="runs at a time on each GPU")
    a.add_argument("--train-args", default=None,
                   help="options for every ocpmx train run, quoted (default: the 30m, 100 M-token "
                        "settings of results/ablation)")
    a.add_argument("--run", default=None,
                   help="analyze: the run whose checkpoint to use (default OUT/bf16/seed0)")
    a.add_argument("--batches", type=int, default=8, help="analyze: consecutive batches")
    a.add_argument("--batch-size", type=int, default=16, help="analyze: sequences per batch")
    a.set_defaults(func=cmd_ablate)

    p = sub.add_parser("plot", help="train/validation loss against tokens for run directories")
    p.add_argument("runs", nargs="+")
    p.add_argument("-o", "--out", default="loss.png")
    p.set_defaults(func=cmd_plot)

    r = sub.add_parser("scale-report", help="throughput table of multi-GPU runs (one directory "
                                            "per run under --runs): tokens/s/GPU, MFU, memory, "
                                            "step breakdown, loss")
    r.add_argument("--runs", required=True, help="folder holding the run directories")
    r.add_argument("--out", default=None, help="where scale.md/json and loss.png go (default --runs)")
    r.add_argument("--warmup", type=int, default=10, help="steps left out of the timing")
    r.set_defaults(func=cmd_scale_report)


def cmd_data(args) -> int:
    from .corpus import build_corpus
    from .data import load_tokenizer, tokenize_split, train_tokenizer
    if args.action == "tokenize":
        tok = load_tokenizer(Path(args.out) / "tokenizer.json")
        for split in ("train", "validation"):
            meta = tokenize_split(args.out, tok, split)
            print(f"{split}: {meta['tokens']:,} tokens ({meta['dtype']}) in "
                  f"{Path(args.out) / f'c4-{split}.tokens.npy'}")
        return 0
    if args.action == "build-corpus":
        info = build_corpus(args.out, args.source, packages=args.packages)
        print(json.dumps(info))
    tok = train_tokenizer(args.out, Path(args.out) / "tokenizer.json", args.vocab_size)
    print(f"tokenizer: {Path(args.out) / 'tokenizer.json'} ({tok.get_vocab_size()} tokens)")
    return 0


def cmd_train(args) -> int:
    from .train import TRAIN_PRESETS, TrainConfig, TrainingDiverged, train
    kw = dict(TRAIN_PRESETS.get(args.train_preset, {})) if args.train_preset else {}
    kw.setdefault("preset", "tiny")
    kw["progress"] = not args.no_progress
    for f in fields(TrainConfig):  # options given on the command line override the preset
        v = getattr(args, f.name, None)
        if v is not None:
            kw[f.name] = v
    cfg = TrainConfig(**kw)
    try:
        result = train(cfg, resume=args.resume)
    except TrainingDiverged as e:
        print(f"ocpmx train: {e}", file=sys.stderr)
        return 3
    except FileNotFoundError as e:
        print(f"ocpmx train: error: {e}", file=sys.stderr)
        return 2
    import os
    if os.environ.get("RANK", "0") != "0":
        return 0
    from .train import read_metrics
    train_rows, val_rows = read_metrics(Path(cfg.out) / "metrics.jsonl")
    print(f"steps {len(train_rows)}  tokens {result['tokens']}  first loss "
          f"{train_rows[0]['loss']:.4f}  last loss {train_rows[-1]['loss']:.4f}  "
          f"val loss {val_rows[-1]['val_loss']:.4f}" if val_rows else "")
    if result.get("tokens_to_target"):
        print(f"target reached after {result['tokens_to_target']} tokens")
    return 0


def cmd_ablate(args) -> int:
    import shlex
    from . import ablation
    if args.action == "run":
        arms = args.arms.split(",") if args.arms else ablation.ARMS
        seeds = [int(x) for x in args.seeds.split(",")]
        if args.gpus is None:
            import torch
            gpus = [str(i) for i in range(torch.cuda.device_count())]
        else:
            gpus = [g for g in args.gpus.split(",") if g and g != "none"]
        train_args = shlex.split(args.train_args) if args.train_args else \
            ablation.DEFAULT_TRAIN_ARGS
        res = ablation.run_ablation(args.out, ablation.plan(arms, seeds), args.data, gpus,
                                    args.per_gpu, train_args)
        bad = {k: v for k, v in res.items() if v != "done"}
        print(f"{len(res) - len(bad)} of {len(res)} runs done" +
              "".join(f"\n  {k}: {v}" for k, v in bad.items()))
        return 0 if all(v in ("done", "diverged") for v in res.values()) else 1
    if args.action == "summarize":
        table = ablation.summarize(args.out)
        print(ablation.table_markdown(table))
        return 0
    from .gradient_error import analyze, markdown
    res = analyze(args.run or str(Path(args.out) / "bf16" / "seed0"), args.out, args.batches,
                  args.batch_size, data=args.data)
    print(markdown(res))
    return 0


def cmd_scale_report(args) -> int:
    from .scale_report import markdown, summarize
    rows = summarize(args.runs, args.out, args.warmup)
    print(markdown(rows, args.warmup))
    return 0 if rows else 1


def cmd_plot(args) -> int:
    from .train import plot
    print(plot(args.runs, args.out))
    return 0

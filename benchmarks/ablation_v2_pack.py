"""Pack the v2 corpus for a GPU machine reached only through calls of at most 64 MiB each
(results/ablation_v2/PLAN.md, Compute; benchmarks/ablation_v2_device.sh receives the parts).

    python benchmarks/ablation_v2_pack.py data/xl /tmp/xfer [--train-shards 24] [--part-mib 46]

Writes /tmp/xfer/part-00, part-01, ...: the first ``--train-shards`` training shards in file
order (PLAN.md: 24 shards hold ~264 M tokens, more than one 250 M-token run reads), every
validation shard, tokenizer.json, MANIFEST.json and CORPUS.json, each part at most ``--part-mib`` MiB.
``--xz`` recompresses the shards with LZMA (smaller parts, slower here). Every part also holds
PARTS.json: each shard's name and the SHA-256 of its text, which the device checks before
tokenizing.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import lzma
import shutil
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def _text_sha(path: Path) -> str:
    with gzip.open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _recompress(src: Path, dst: Path) -> None:
    with gzip.open(src, "rb") as i, lzma.open(dst, "wb", preset=6) as o:
        shutil.copyfileobj(i, o, 1 << 22)


def _map(jobs: int, fn, *its) -> list:
    if jobs <= 1:
        return list(map(fn, *its))
    with ProcessPoolExecutor(jobs) as ex:
        return list(ex.map(fn, *its))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data")
    ap.add_argument("out")
    ap.add_argument("--train-shards", type=int, default=24)
    ap.add_argument("--part-mib", type=float, default=46.0)
    ap.add_argument("--xz", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    data, out = Path(a.data), Path(a.out)
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} is not empty: parts of an earlier pack would mix with these")
    train = sorted(data.glob("c4-train.*.json.gz"))
    if len(train) < a.train_shards:
        raise SystemExit(f"{data} holds {len(train)} training shards, fewer than "
                         f"--train-shards {a.train_shards}")
    shards = train[:a.train_shards] + sorted(data.glob("c4-validation.*.json.gz"))
    shas = dict(zip([p.name for p in shards], _map(a.jobs, _text_sha, shards)))
    stage = out / "stage"
    stage.mkdir(parents=True, exist_ok=True)
    files = []
    if a.xz:
        dsts = [stage / (p.name[:-3] + ".xz") for p in shards]
        _map(a.jobs, _recompress, shards, dsts)
        files = dsts
    else:
        files = list(shards)
    meta = {"shards": shas, "train_shards": a.train_shards,
            "source": str(data.resolve())}
    if not (data / "tokenizer.json").is_file():
        raise SystemExit(f"{data} holds no tokenizer.json")
    small = [data / n for n in ("tokenizer.json", "MANIFEST.json", "CORPUS.json")
             if (data / n).is_file()]
    limit = int(a.part_mib * 2**20)
    parts: list[list[Path]] = [[*small]]
    for f in sorted(files, key=lambda p: p.stat().st_size, reverse=True):
        s = f.stat().st_size
        if s > limit:
            raise SystemExit(f"{f.name} is {s / 2**20:.1f} MiB, over --part-mib {a.part_mib}")
        # first fit: the largest files first, each into the first part with room
        for i, part in enumerate(parts):
            used = sum(p.stat().st_size for p in part)
            if used + s <= limit:
                part.append(f)
                break
        else:
            parts.append([f])
    for i, part in enumerate(parts):
        d = out / f"part-{i:02d}"
        d.mkdir(exist_ok=True)
        for f in part:
            shutil.copy2(f, d / f.name)
        (d / "PARTS.json").write_text(json.dumps(meta, indent=1))
        mib = sum(f.stat().st_size for f in part) / 2**20
        print(f"{d}: {len(part)} files, {mib:.1f} MiB")
    shutil.rmtree(stage)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

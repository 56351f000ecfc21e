"""Pack the v2 corpus for a GPU machine reached only through calls of at most 64 MiB each
(results/ablation_v2/PLAN.md, Compute; benchmarks/ablation_v2_device.sh receives the parts).

    python benchmarks/ablation_v2_pack.py data/xl /tmp/xfer [--train-shards 24] [--part-mib MIB]

Writes /tmp/xfer/part-00, part-01, ...: the first ``--train-shards`` training shards in file
order (PLAN.md: 24 shards hold ~264 M tokens, more than one 250 M-token run reads), every
validation shard, tokenizer.json, MANIFEST.json and CORPUS.json, each part at most ``--part-mib`` MiB.
By default that is what a call leaves beside this repository's working tree (tracked files and
untracked ones git does not ignore: they travel with every call) and the code archive the last
part carries: 64 MiB - the tree - ``RESERVE_MIB``, every file counted in whole 4 KiB blocks, as
the device counts a call (the sixteenth session: a 30.6 MiB tree and a 32.9 MiB part, 63.5 MiB
in bytes, were refused; in 4 KiB blocks they are 65.7 MiB). (The fourteenth session found the
40 MiB parts of an earlier pack over the limit once results had grown the tree to 28 MiB.)
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
import subprocess
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

CALL_MIB = 64  # what one device call may send: the working tree and the carried folders
RESERVE_MIB = 5  # the code archive (`git archive`, ~2 MiB) and the tree's growth meanwhile
BLOCK = 4096  # a file's size as a call counts it: whole blocks of this many bytes
REPO = Path(__file__).resolve().parents[1]


def disk_bytes(size: int) -> int:
    """``size`` bytes rounded up to whole ``BLOCK``s (an empty file takes none)."""
    return -(-size // BLOCK) * BLOCK


def tree_bytes(root: Path = REPO) -> int:
    """Bytes of what a device call sends from ``root`` besides its carried folders: tracked
    files and untracked ones git does not ignore, each in whole ``BLOCK``s."""
    out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], capture_output=True, check=True).stdout
    files = {root / p for p in out.decode().split("\0") if p}
    return sum(disk_bytes(f.stat().st_size) for f in files if f.is_file())


def auto_part_mib(tree: int) -> float:
    """The largest part that fits a call beside a tree of ``tree`` bytes and the reserve."""
    mib = CALL_MIB - RESERVE_MIB - tree / 2**20
    if mib < 8:
        raise SystemExit(f"the working tree is {tree / 2**20:.1f} MiB: parts beside it would be "
                         f"under 8 MiB; pass --part-mib, or send less with each call")
    return mib


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
    ap.add_argument("--part-mib", type=float, default=None,
                    help="largest part in MiB (default: 64 - this working tree - "
                         f"{RESERVE_MIB}, what a device call leaves)")
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
    if a.part_mib is None:
        a.part_mib = auto_part_mib(tree_bytes())
        print(f"parts of at most {a.part_mib:.1f} MiB (64 MiB less this working tree and "
              f"{RESERVE_MIB} MiB)")
    limit = int(a.part_mib * 2**20)
    limit -= disk_bytes(len(json.dumps(meta, indent=1).encode()))  # PARTS.json, in every part
    parts: list[list[Path]] = [[*small]]
    for f in sorted(files, key=lambda p: p.stat().st_size, reverse=True):
        s = disk_bytes(f.stat().st_size)
        if s > limit:
            raise SystemExit(f"{f.name} is {s / 2**20:.1f} MiB, over --part-mib {a.part_mib}")
        # first fit: the largest files first, each into the first part with room
        for i, part in enumerate(parts):
            used = sum(disk_bytes(p.stat().st_size) for p in part)
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
        mib = sum(disk_bytes(f.stat().st_size) for f in part) / 2**20  # as a call counts
        print(f"{d}: {len(part)} files, {mib:.1f} MiB")
    shutil.rmtree(stage)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

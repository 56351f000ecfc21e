"""benchmarks/ablation_v2_pack.py: the v2 corpus split into parts small enough for a device call;
every shard lands in exactly one part, no part is over the limit, and the text hashes match."""
import gzip
import hashlib
import importlib.util
import json
import lzma
import random
from pathlib import Path

import pytest

from ocpmx.llama_train.data import write_shard

ROOT = Path(__file__).resolve().parents[1]


def _pack():
    spec = importlib.util.spec_from_file_location("pack", ROOT / "benchmarks" / "ablation_v2_pack.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _corpus(d: Path, n_train: int = 6) -> None:
    rng = random.Random(0)
    for i in range(n_train):
        # incompressible text, so the part sizes are what the test sets
        docs = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(60_000))
                for _ in range(1 + i % 3)]
        write_shard(d / f"c4-train.{i:05d}-of-{n_train:05d}.json.gz", docs)
    write_shard(d / "c4-validation.00000-of-00001.json.gz", ["validation text"])
    (d / "tokenizer.json").write_text("{}")
    (d / "MANIFEST.json").write_text("{}")


@pytest.mark.parametrize("xz", [False, True])
def test_parts_hold_every_shard_once_under_the_limit(tmp_path, xz):
    data, out = tmp_path / "xl", tmp_path / "xfer"
    data.mkdir()
    _corpus(data)
    part_mib = 0.15
    args = [str(data), str(out), "--train-shards", "4", "--part-mib", str(part_mib), "--jobs", "1"]
    assert _pack().main(args + (["--xz"] if xz else [])) == 0
    with pytest.raises(SystemExit, match="not empty"):  # a second pack into the same folder
        _pack().main(args)
    parts = sorted(out.glob("part-*"))
    assert len(parts) > 1
    seen = []
    for p in parts:
        files = [f for f in p.iterdir() if f.name != "PARTS.json"]
        # the whole part, PARTS.json too, in the device's 4 KiB blocks
        assert sum(_pack().disk_bytes(f.stat().st_size) for f in p.iterdir()) <= part_mib * 2**20
        seen += [f.name for f in files]
    meta = json.loads((parts[0] / "PARTS.json").read_text())
    want = [f"c4-train.{i:05d}-of-00006.json" for i in range(4)] + ["c4-validation.00000-of-00001.json"]
    ext = ".xz" if xz else ".gz"
    assert sorted(seen) == sorted([w + ext for w in want] + ["tokenizer.json", "MANIFEST.json"])
    assert sorted(meta["shards"]) == sorted(w + ".gz" for w in want)
    for name, sha in meta["shards"].items():
        f = next(out.glob(f"part-*/{name[:-3]}{ext}"))
        text = lzma.open(f).read() if xz else gzip.open(f).read()
        assert hashlib.sha256(text).hexdigest() == sha
        assert text == gzip.open(data / name).read()


def test_too_few_shards_is_an_error(tmp_path):
    data = tmp_path / "xl"
    data.mkdir()
    _corpus(data, n_train=2)
    with pytest.raises(SystemExit, match="2 training shards"):
        _pack().main([str(data), str(tmp_path / "o"), "--train-shards", "24"])


def test_default_part_size_leaves_room_for_the_working_tree(tmp_path):
    """The default part size: 64 MiB less what a device call sends anyway (tracked files and
    untracked ones git does not ignore, never ignored ones, each in whole 4 KiB blocks, as the
    device counts them) and the reserve; a tree too large for useful parts is an error that
    says so."""
    import subprocess
    pack = _pack()
    repo = tmp_path / "r"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("ignored/\n")
    (repo / "tracked.bin").write_bytes(b"x" * 3000)
    subprocess.run(["git", "-C", str(repo), "add", "tracked.bin", ".gitignore"], check=True)
    (repo / "untracked.bin").write_bytes(b"y" * 500)
    (repo / "ignored").mkdir()
    (repo / "ignored" / "big.bin").write_bytes(b"z" * 100_000)
    (repo / "block.bin").write_bytes(b"w" * 4097)
    subprocess.run(["git", "-C", str(repo), "add", "block.bin"], check=True)
    (repo / "empty.bin").write_bytes(b"")
    assert pack.tree_bytes(repo) == 4096 + 4096 + 4096 + 8192  # 3000, 500, .gitignore, 4097
    assert pack.auto_part_mib(20 * 2**20) == pack.CALL_MIB - pack.RESERVE_MIB - 20
    with pytest.raises(SystemExit, match="the working tree is 55.0 MiB"):
        pack.auto_part_mib(55 * 2**20)

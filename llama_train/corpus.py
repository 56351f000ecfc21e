"""Offline English corpora in the C4 layout.

Sources:
* ``stdlib``: the documentation strings of the Python standard library (modules, classes,
  functions, methods). Real English technical prose, 0.7 M characters, available on any machine
  with Python. It is what the CPU demo and the CI tests use.
* ``debian``: the Sphinx sources of Debian's documentation packages, fetched with
  ``apt-get download`` and unpacked with ``dpkg -x`` (no root install): by default
  ``linux-doc-6.1`` (the Linux kernel's Documentation/, GPL-2.0) and ``python3.11-doc`` (the
  Python 3.11 manual, PSF licence). That is about 45 MB of English prose and reST, sized for
  the small-scale ablations; the shards stay under the GPU machine's 64 MiB transfer limit.

Documents are split into train and validation by a hash of their text (deterministic).

Layout written: ``c4-train.00000-of-0000N.json.gz`` ... and ``c4-validation.00000-of-00001.json.gz``
(one JSON object per line with "text"), the same layout the loader reads for real C4.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import sys
import warnings
from pathlib import Path

from .data import write_shard

# modules with side effects on import (GUIs, easter eggs) or platform-only ones
SKIP = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "msvcrt", "winreg",
        "winsound", "_winapi", "nt", "pydoc_data", "lib2to3", "ensurepip", "venv", "__main__"}


def stdlib_documents(min_chars: int = 100) -> list[str]:
    docs, seen = [], set()
    names = sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in SKIP)
    for name in names:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module this platform lacks
            continue
        objs = [mod] + [v for _, v in sorted(vars(mod).items())
                        if (inspect.isclass(v) or inspect.isfunction(v))
                        and getattr(v, "__module__", None) == name]
        for obj in list(objs):
            if inspect.isclass(obj):
                objs += [v for _, v in sorted(vars(obj).items()) if inspect.isfunction(v)]
        for obj in objs:
            doc = inspect.getdoc(obj)
            if doc and len(doc) >= min_chars and doc not in seen:
                seen.add(doc)
                docs.append(doc)
    return docs


DEBIAN_PACKAGES = ("linux-doc-6.1", "python3.11-doc")


def debian_documents(packages=DEBIAN_PACKAGES, workdir=None, min_chars: int = 200) -> list[str]:
    """The Sphinx sources (``html/_sources/**/*.txt``) of Debian documentation packages."""
    import shutil
    import subprocess
    import tempfile
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"source 'debian' needs {tool} (a Debian or Ubuntu machine)")
    work = Path(workdir or tempfile.mkdtemp(prefix="ocpmx-debs-"))
    lists = work / "lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    apt = ["apt-get", f"-oDir::State::Lists={lists}"]
    subprocess.run(apt + ["update"], check=True, capture_output=True)
    docs = []
    for pkg in packages:
        subprocess.run(apt + ["download", pkg], check=True, capture_output=True, cwd=work)
        deb = sorted(work.glob(f"{pkg}_*.deb"))[-1]
        root = work / pkg
        subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
        for f in sorted(root.rglob("_sources/**/*.txt")):
            text = f.read_text(encoding="utf-8", errors="replace").strip()
            if len(text) >= min_chars:
                docs.append(text)
    return docs


def build_corpus(out_dir, source: str = "stdlib", n_train_shards: int = 4,
                 val_fraction: float = 0.05) -> dict:
    if source == "stdlib":
        docs = stdlib_documents()
    elif source == "debian":
        docs = debian_documents()
        n_train_shards = max(n_train_shards, 8)
    else:
        raise ValueError(f"unknown corpus source {source!r}; available: 'stdlib', 'debian'")
    if not docs:
        raise RuntimeError("found no documentation strings")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, val = [], []
    for d in docs:
        h = int.from_bytes(hashlib.sha256(d.encode()).digest()[:8], "little")
        (val if h % 10_000 < val_fraction * 10_000 else train).append(d)
    for i in range(n_train_shards):
        write_shard(out / f"c4-train.{i:05d}-of-{n_train_shards:05d}.json.gz", train[i::n_train_shards])
    write_shard(out / "c4-validation.00000-of-00001.json.gz", val)
    info = {"source": source, "python": sys.version.split()[0], "documents": len(docs),
            "packages": list(DEBIAN_PACKAGES) if source == "debian" else [],
            "train_documents": len(train), "validation_documents": len(val),
            "characters": sum(map(len, docs))}
    (out / "CORPUS.json").write_text(__import__("json").dumps(info, indent=1))
    return info

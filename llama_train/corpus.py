"""Offline English corpora in the C4 layout.

Sources:
* ``stdlib``: the documentation strings of the Python standard library (modules, classes,
  functions, methods). Real English technical prose, 0.7 M characters, available on any machine
  with Python. It is what the CPU demo and the CI tests use.
* ``debian``: Debian's documentation packages, fetched with ``apt-get download`` and unpacked
  with ``dpkg -x`` (no root install). Package set ``default``: ``linux-doc-6.1`` (the Linux
  kernel's Documentation/, GPL-2.0) and ``python3.11-doc`` (the Python 3.11 manual, PSF
  licence), 34 M characters of English prose and reST. Package set ``large`` adds a dictionary
  of English, Perl's, git's and PostgreSQL's manuals (93 M characters in all, about 25 M tokens
  with a 32k BPE) for the ablations; its shards still fit the GPU machine's 64 MiB transfer.

Documents are split into train and validation by a hash of their text (deterministic).

Layout written: ``c4-train.00000-of-0000N.json.gz`` ... and ``c4-validation.00000-of-00001.json.gz``
(one JSON object per line with "text"), the same layout the loader reads for real C4.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import random
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
# a larger set for the ablations (about 130 M characters): the default two, plus the GNU
# Collaborative International Dictionary of English (GPL), Perl's manual pages (Artistic/GPL),
# git's manual (GPL-2.0) and PostgreSQL's manual (PostgreSQL licence)
DEBIAN_PACKAGE_SETS = {
    "default": DEBIAN_PACKAGES,
    "large": DEBIAN_PACKAGES + ("dict-gcide", "perl-doc", "git-doc", "postgresql-doc-15"),
}
# what to read in each package: (file glob, kind); kind 'text' = one document per file,
# 'html' = one document per file with the markup removed, 'chunks' = one large text cut into
# documents of about CHUNK characters at blank lines. Gzip'd files (.gz, dictzip .dz) are read
# through gzip. Packages not listed here contribute their Sphinx sources.
DEBIAN_FILES = {
    "dict-gcide": [("**/gcide.dict.dz", "chunks")],
    "perl-doc": [("**/pod/*.pod", "text")],
    "git-doc": [("**/git-doc/*.txt", "text")],
    "postgresql-doc-15": [("**/html/*.html", "html")],
}
SPHINX_FILES = [("**/_sources/**/*.txt", "text")]
CHUNK = 20_000


def _read(path: Path) -> str:
    import gzip
    if path.suffix in (".gz", ".dz"):
        with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
            return f.read()
    return path.read_text(encoding="utf-8", errors="replace")


def html_text(html: str) -> str:
    """The visible text of an HTML page (scripts and styles dropped), blank lines collapsed."""
    from html.parser import HTMLParser

    class Text(HTMLParser):
        def __init__(self):
            super().__init__()
            self.parts, self.skip = [], 0

        def handle_starttag(self, tag, attrs):
            self.skip += tag in ("script", "style")
            if tag in ("p", "div", "br", "tr", "li", "pre", "h1", "h2", "h3", "h4", "table"):
                self.parts.append("\n")

        def handle_endtag(self, tag):
            self.skip -= tag in ("script", "style") and self.skip > 0

        def handle_data(self, data):
            if not self.skip:
                self.parts.append(data)

    t = Text()
    t.feed(html)
    lines = [l.rstrip() for l in "".join(t.parts).splitlines()]
    out, blank = [], False
    for l in lines:
        if l.strip() or not blank:
            out.append(l)
        blank = not l.strip()
    return "\n".join(out).strip()


def chunks(text: str, size: int = CHUNK) -> list[str]:
    """Cut a long text into documents of about ``size`` characters at blank lines."""
    docs, cur, n = [], [], 0
    for para in text.split("\n\n"):
        cur.append(para)
        n += len(para) + 2
        if n >= size:
            docs.append("\n\n".join(cur).strip())
            cur, n = [], 0
    if cur:
        docs.append("\n\n".join(cur).strip())
    return docs


def package_documents(root: Path, package: str, min_chars: int = 200) -> list[str]:
    docs = []
    for pattern, kind in DEBIAN_FILES.get(package, SPHINX_FILES):
        for f in sorted(root.glob(pattern)):
            text = _read(f)
            if kind == "html":
                text = html_text(text)
            parts = chunks(text) if kind == "chunks" else [text.strip()]
            docs += [d for d in parts if len(d) >= min_chars]
    return docs


def debian_documents(packages=DEBIAN_PACKAGES, workdir=None, min_chars: int = 200) -> list[str]:
    """The documents of Debian documentation packages (see DEBIAN_FILES), fetched with
    ``apt-get download`` and unpacked with ``dpkg -x``."""
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
        found = package_documents(root, pkg, min_chars)
        if not found:
            raise RuntimeError(f"package {pkg} gave no documents (see DEBIAN_FILES)")
        docs += found
    return docs


def build_corpus(out_dir, source: str = "stdlib", n_train_shards: int | None = None,
                 val_fraction: float | None = None, packages: str = "default", **xl) -> dict:
    """Build a corpus in the C4 layout. ``source`` 'debian-xl' (the ablation's v2 corpus) is
    ``corpus_xl.build``: ``packages`` 'default' means the manifest's packages where ``xl``
    has a ``manifest``, else the package set v2 (as 'v2'), and ``xl`` passes its options
    (``manifest``, ``workdir``, ``n_train_shards``, ``val_fraction``)."""
    pkgs = []
    if source == "debian-xl":
        from . import corpus_xl
        from .corpus_xl_packages import PACKAGE_SETS
        # a rebuild of a manifest takes its packages unless others are named
        names = None if packages == "default" and xl.get("manifest") is not None else \
            PACKAGE_SETS["v2" if packages == "default" else packages]
        if n_train_shards is not None:
            xl["n_train_shards"] = n_train_shards
        if val_fraction is not None:
            xl["val_fraction"] = val_fraction
        return corpus_xl.build(out_dir, names, **xl)
    n_train_shards = 4 if n_train_shards is None else n_train_shards
    val_fraction = 0.05 if val_fraction is None else val_fraction
    if source == "stdlib":
        docs = stdlib_documents()
    elif source == "debian":
        if packages not in DEBIAN_PACKAGE_SETS:
            raise ValueError(f"unknown Debian package set {packages!r}; available: "
                             f"{sorted(DEBIAN_PACKAGE_SETS)}")
        pkgs = list(DEBIAN_PACKAGE_SETS[packages])
        docs = debian_documents(pkgs)
        n_train_shards = max(n_train_shards, 8 * len(pkgs) // 2)
    else:
        raise ValueError(f"unknown corpus source {source!r}; available: 'stdlib', 'debian', "
                         "'debian-xl'")
    if not docs:
        raise RuntimeError("found no documentation strings")
    # documents in a seeded random order: the sources come package by package, and a shard (or
    # the validation set, the first sequences of its file) must mix them as C4's do
    random.Random(0).shuffle(docs)
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
            "packages": pkgs,
            "train_documents": len(train), "validation_documents": len(val),
            "characters": sum(map(len, docs)), "shuffled": True}
    (out / "CORPUS.json").write_text(__import__("json").dumps(info, indent=1))
    return info

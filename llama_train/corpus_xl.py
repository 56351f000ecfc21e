"""The debian-xl corpora (``ocpmx data build-corpus --source debian-xl --packages v2|v3``):
enough unique, mostly natural-language text that a run of several hundred million tokens never
sees a token twice, built offline and reproducibly from packages that Debian's archive serves by
name. v2 is the ablation's corpus (344.5 M tokens); v3 adds some 13,000 packages (issue 16's
>= 600 M tokens; results/ablation_v2/CORPUS.md).

What goes in (``corpus_xl_packages``: ``XL_PACKAGES``, one table: package -> (category,
[(file glob, kind)]), and ``FAMILIES``, the same for every package whose name matches a
regular expression; the text extraction itself is ``corpus_extract``, whose code alone keys
the extraction cache):
* ``rfc``: the IETF RFCs (``doc-rfc-*``, Debian's non-free component), their plain-text
  editions with the page headers, footers and dot leaders removed;
* ``manual``: TeX Live's package manuals (the PDFs, through ``pdftotext``), HTML manuals of
  large projects (Erlang/OTP, the JDK, pandas, SciPy, statsmodels, scikit-learn, SageMath,
  Django, Rust, Racket, Qt, ...), GNU info manuals (GCC, GDB, glibc, gawk, make, Bison, Emacs),
  man pages, the Debian Administrator's Handbook, the v1 set (Linux and Python docs, Perl, git,
  PostgreSQL); v3: more manuals and API references, every Perl module's man pages, every
  Python package's Sphinx manual;
* ``dictionary``: GCIDE, WordNet, the Jargon File, FOLDOC, the Devil's Dictionary;
* ``comments``: the comments of the Linux kernel's and GCC's C sources (natural language about
  code; a minority of the corpus, listed separately in the manifest); v3: glibc's, binutils'
  and GDB's, Go's and Rust's own sources and every Go and Rust package's, and the docstrings
  and comments of every Python package (licence blocks dropped).

Every document is cleaned (whitespace, boilerplate lines that recur across a package's
documents), filtered (at least ``min_chars`` characters, mostly letters), de-duplicated across
the whole corpus (SHA-256 of the text), then assigned by a seeded hash of its text to the
validation split (``val_fraction``) or to one of ``n_train_shards`` training shards, and shuffled
within its shard. Training shards are thus uniform random samples of the corpus: any subset of
them is one too, and validation is drawn across the whole corpus.

``MANIFEST.json`` (written to OUT; v2's committed as results/ablation_v2/corpus_manifest.json,
v3's as corpus_v3_manifest.json.gz) lists every package with its version, the SHA-256 of its
.deb, its documents, characters and the SHA-256 of its extracted text (and its family, if
any), the tools' versions and the shards' SHA-256. Given a manifest, ``build(...,
manifest=...)`` downloads exactly those versions and fails if a .deb's hash differs.

Needs apt-get and dpkg (a Debian or Ubuntu machine; nothing is installed, packages are unpacked
with ``dpkg -x``) and ``pdftotext`` (``apt-get install poppler-utils``) for the PDF manuals.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

from .corpus_extract import drop_boilerplate, mostly_words, package_documents, tool_versions
from .corpus_xl_packages import (COMPONENTS, FAMILIES, FAMILY_EXCLUDED, PACKAGE_SETS,
                                 XL_PACKAGES)
from .data import write_shard


# ---- fetching -------------------------------------------------------------------------------------

def apt_sources(components=COMPONENTS) -> str:
    """A one-line-style sources list with this machine's Debian archive entries (their URIs and
    suites), each with ``components``: the machine may list main only, and the RFCs are in
    non-free. Reads /etc/apt/sources.list and /etc/apt/sources.list.d/*.sources|*.list."""
    entries = []
    etc = Path("/etc/apt")
    files = [etc / "sources.list"] + sorted((etc / "sources.list.d").glob("*.list"))
    for f in files:
        if f.is_file():
            for line in f.read_text().splitlines():
                m = re.match(r"\s*deb\s+(\[[^\]]*\]\s+)?(\S+)\s+(\S+)\s+(.*)", line)
                if m and "main" in m.group(4).split():
                    entries.append((m.group(2), m.group(3)))
    for f in sorted((etc / "sources.list.d").glob("*.sources")):
        for stanza in f.read_text().split("\n\n"):
            fields = {}
            for line in stanza.splitlines():
                if ":" in line and not line.startswith((" ", "#")):
                    k, _, v = line.partition(":")
                    fields[k.strip()] = v.strip()
            if "deb" in fields.get("Types", "").split() and "main" in \
                    fields.get("Components", "").split():
                for uri in fields.get("URIs", "").split():
                    for suite in fields.get("Suites", "").split():
                        entries.append((uri, suite))
    if not entries:
        raise RuntimeError("no Debian archive with a 'main' component in /etc/apt: source "
                           "'debian-xl' needs one")
    return "".join(f"deb {uri} {suite} {' '.join(components)}\n" for uri, suite in entries)


def _apt(work: Path) -> list[str]:
    """apt-get with its own sources list (main, contrib, non-free) and package lists in
    ``work``: the machine's apt configuration is read, never changed."""
    src = work / "sources.list"
    if not src.is_file():
        src.write_text(apt_sources())
    lists = work / "lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    (work / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    # Dir::State::status /dev/null: what this machine has installed (from any repository) is
    # neither a candidate nor a reason to skip one
    return ["apt-get", f"-oDir::Etc::SourceList={src}", "-oDir::Etc::SourceParts=/nonexistent",
            f"-oDir::State::Lists={lists}", f"-oDir::Cache={work / 'cache'}",
            "-oDir::State::status=/dev/null"]


def available_packages(work: Path) -> list[str]:
    """The names of the packages the archive (this machine's Debian suites, ``COMPONENTS``)
    serves, from ``apt-cache pkgnames`` over the package lists in ``work``."""
    apt = _apt(work)
    if not any((work / "lists").glob("*_Packages*")):
        subprocess.run(apt + ["update"], check=True, capture_output=True)
    done = subprocess.run(["apt-cache", *apt[1:], "pkgnames"], check=True, capture_output=True,
                          text=True)
    return sorted(set(done.stdout.split()))


def expand_families(entries, names) -> list[str]:
    """``entries`` with each family (a key of ``FAMILIES``) replaced by the names in ``names``
    that it matches, sorted, less ``FAMILY_EXCLUDED``; a name already listed (by itself or by
    an earlier family) stays where it was first listed."""
    out, seen = [], set()
    for e in entries:
        members = sorted(n for n in names if re.fullmatch(e, n) and n not in FAMILY_EXCLUDED) \
            if e in FAMILIES else [e]
        for m in members:
            if m not in seen:
                seen.add(m)
                out.append(m)
    return out


def family_of(pkg: str) -> str | None:
    """The first family whose expression matches ``pkg`` (None: no family)."""
    return next((f for f in FAMILIES if re.fullmatch(f, pkg)), None)


def _debs_by_name(debs: Path) -> dict[str, list[Path]]:
    """{package: its .debs in ``debs``} from the file names (``name_version_arch.deb``)."""
    found: dict[str, list[Path]] = {}
    for d in sorted(debs.glob("*.deb")):
        found.setdefault(d.name.split("_", 1)[0], []).append(d)
    return found


def _file_version(deb: Path) -> str:
    """The version in a .deb's file name as apt-get download writes it (epoch ':' as '%3a')."""
    return unquote(deb.name.split("_")[1])


_URI = re.compile(r"'(\S+)' (\S+) (\d+) (SHA512|SHA256):([0-9a-f]+)$")


def _download(uri: str, dest: Path, size: int, algo: str, digest: str, tries: int = 4) -> None:
    """``uri`` (http, https or file) into ``dest`` (a temporary name, then a rename), checked
    against the size and hash (``algo`` 'SHA512' or 'SHA256') the archive's signed package lists
    give, what apt-get itself checks; a failed or differing transfer is tried again (``tries``
    in all, 1, 2, 4 s apart)."""
    import http.client
    import urllib.request
    tmp = dest.with_name(dest.name + ".part")
    for attempt in range(tries):
        problem = None
        try:
            h = hashlib.new(algo.lower())
            with urllib.request.urlopen(uri, timeout=120) as r, open(tmp, "wb") as f:
                for block in iter(lambda: r.read(1 << 20), b""):
                    h.update(block)
                    f.write(block)
            if tmp.stat().st_size != size or h.hexdigest() != digest:
                problem = f"size or {algo} differs from the package lists'"
        except (OSError, http.client.HTTPException) as e:  # URLError, timeouts, resets
            problem = f"{type(e).__name__}: {e}"
        if problem is None:
            os.replace(tmp, dest)
            return
        tmp.unlink(missing_ok=True)
        if attempt < tries - 1:
            time.sleep(2 ** attempt)
    raise RuntimeError(f"{uri}: {problem} ({tries} tries)")


def _print_uris(apt: list[str], names: list[str]) -> list[re.Match]:
    """apt-get's download URI, file name, size and hash of each of ``names`` (run in an empty
    directory: apt prints nothing for a .deb already in its working directory)."""
    with tempfile.TemporaryDirectory() as empty:
        done = subprocess.run(apt + ["download", "--print-uris", *names], capture_output=True,
                              text=True, cwd=empty)
    if done.returncode:
        raise RuntimeError(f"apt-get download {' '.join(names)} failed: {done.stderr.strip()}")
    found = [m for m in map(_URI.match, done.stdout.splitlines()) if m]
    if len(found) != len(names):
        raise RuntimeError(f"apt-get download --print-uris gave {len(found)} URIs for "
                           f"{len(names)} packages: {done.stdout.strip()[:2000]}")
    return found


def fetch_debs(packages, work: Path, pins: dict[str, str] | None = None,
               batch: int = 500, connections: int = 8) -> dict[str, Path]:
    """{package: its .deb in work/debs}, ``name=version`` where ``pins`` names a version; .debs
    already there are reused. apt-get resolves the names (``download --print-uris``, ``batch``
    names a call; a batch that fails is retried name by name, so that the error names the
    package) and each .deb comes over one of ``connections`` at once, checked against the
    size and hash that the archive's signed lists give (thousands of small packages: one
    apt-get call each would take hours); a URI of another scheme than http, https or file
    (``mirror+file:``, ``tor+http:``) is left to ``apt-get download`` itself."""
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"source 'debian-xl' needs {tool} (a Debian or Ubuntu machine)")
    pins = pins or {}
    debs = work / "debs"
    debs.mkdir(parents=True, exist_ok=True)

    def wanted(p, have):
        return [d for d in have.get(p, []) if p not in pins or _file_version(d) == pins[p]]

    def spec(p):  # what apt-get is asked for
        return f"{p}={pins[p]}" if p in pins else p

    have = _debs_by_name(debs)
    missing = [p for p in packages if not wanted(p, have)]
    if missing:
        apt = _apt(work)
        subprocess.run(apt + ["update"], check=True, capture_output=True)
        names = [spec(p) for p in missing]
        found = []
        for i in range(0, len(names), batch):
            part = names[i:i + batch]
            try:
                found += _print_uris(apt, part)
            except RuntimeError:
                for name in part:  # the error names the package
                    found += _print_uris(apt, [name])
        direct = [m for m in found if m.group(1).startswith(("http:", "https:", "file:"))]
        by_apt = [m.group(2).split("_", 1)[0] for m in found if m not in direct]
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(connections) as pool:
            list(pool.map(lambda m: _download(m.group(1), debs / m.group(2), int(m.group(3)),
                                              m.group(4), m.group(5)), direct))
        for i in range(0, len(by_apt), batch):
            part = [spec(p) for p in by_apt[i:i + batch]]
            subprocess.run(apt + ["download", *part], cwd=debs, check=True, capture_output=True)
        have = _debs_by_name(debs)
    out = {}
    for p in packages:
        found = wanted(p, have)
        if not found:
            raise RuntimeError(f"{p}: no .deb in {debs} after the download")
        out[p] = found[-1]
    return out


def _deb_version(deb: Path) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True,
                          text=True, check=True).stdout.strip()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---- the build --------------------------------------------------------------------------------

@functools.cache
def _extractor_hash() -> str:
    """SHA-256 of the extraction code (corpus_extract.py and corpus.py), read once a process:
    a cached package's documents are reused only by the code that made them."""
    h = hashlib.sha256()
    here = Path(__file__)
    for f in (here.with_name("corpus_extract.py"), here.with_name("corpus.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _cache_file(work: Path, pkg: str, sha: str, rules, min_chars: int) -> Path:
    """Where a package's extracted documents are kept: keyed by its .deb's SHA-256, the
    minimum length, its rules and the extraction code (``_extractor_hash``)."""
    rules_hash = hashlib.sha256(json.dumps([list(r) for r in rules]).encode()).hexdigest()[:8]
    return work / "docs" / f"{pkg}_{sha[:16]}_{min_chars}_{rules_hash}_{_extractor_hash()}.json.gz"


def _read_cache(cache: Path) -> tuple[int, list[str]]:
    with gzip.open(cache, "rt", encoding="utf-8") as f:
        c = json.load(f)
    return c["extracted_documents"], c["documents"]


def _extracted(work: Path, pkg: str, deb: Path, sha: str, rules, min_chars: int,
               processes: int | None = None) -> Path:
    """The cache file of one package's documents (files' document count, cleaned and filtered
    documents): unpacked and extracted (the slow part: PDFs, HTML) unless ``work/docs`` has
    the same .deb extracted by the same code and rules, so that an interrupted build resumes
    package by package. The cache file is written atomically (a temporary name, then a
    rename)."""
    cache = _cache_file(work, pkg, sha, rules, min_chars)
    if cache.exists():
        return cache
    root = work / "x" / pkg
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True)
    docs = package_documents(root, rules, min_chars, processes)
    n_files = len(docs)
    docs = [d for d in drop_boilerplate(docs) if len(d) >= min_chars and mostly_words(d)]
    shutil.rmtree(root)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(cache.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=1) as f:
        json.dump({"extracted_documents": n_files, "documents": docs}, f)
    os.replace(tmp, cache)
    return cache


def _package_job(args):
    """One package in a worker of the build's pool: (SHA-256 of its .deb, version, its cache
    file); the cache file is None where the .deb's hash differs from ``want``. The documents
    stay on disk: the parent reads them in package order, so nothing piles up in memory
    while a slow package holds the order."""
    work, pkg, deb, want, rules, min_chars = args
    sha = _sha256_file(deb)
    if want is not None and sha != want:
        return sha, None, None
    return sha, _deb_version(deb), _extracted(work, pkg, deb, sha, rules, min_chars, processes=1)


def read_manifest(path) -> dict:
    """A build's MANIFEST.json, plain or gzipped (``.gz``: v3's, with ~13,000 packages)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            manifest = json.load(f)
    except (ValueError, EOFError, gzip.BadGzipFile) as e:  # JSON, UTF-8, gzip errors
        raise ValueError(f"{path}: not a corpus manifest ({e})") from e
    if not isinstance(manifest, dict) or "packages" not in manifest:
        raise ValueError(f"{path}: not a corpus manifest (no 'packages')")
    return manifest


def _key(text: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}\0{text}".encode()).digest()[:8], "little")


def build(out_dir, packages=None, table=None, n_train_shards: int = 32,
          val_fraction: float = 0.01, seed: int = 0, min_chars: int = 200, workdir=None,
          manifest: dict | None = None, keep_work: bool = True, log=print,
          processes: int | None = None) -> dict:
    """Build the corpus in ``out_dir`` (C4 layout: c4-train.NNNNN-of-NNNNN.json.gz,
    c4-validation.00000-of-00001.json.gz, MANIFEST.json, CORPUS.json); returns the manifest.

    ``packages``: names from ``table`` (default ``XL_PACKAGES``) and families (keys of
    ``FAMILIES``: each stands for the archive's packages it matches, ``expand_families``; a
    family's member may give no document); by default the manifest's packages, else the v2
    set (``table`` the default) or all of ``table``. ``manifest``: a previous build's
    manifest, rebuilt as it was: its packages in its order (by default; a name it lacks is an
    error), its versions (the .deb hashes must match), its categories and
    extraction rules (not the table's later ones), and its seed, split and minimum length (an
    argument that differs is an error). A package that gives no document (no file matches its
    rules, or none has enough text: a glob is wrong, or the package's layout changed) is an
    error, except in a rebuild of a manifest that records it so (then a warning).
    ``workdir`` keeps the downloads and each package's extracted documents (both reused by a
    later build: an interrupted build resumes where it stopped) and the temporary buckets.
    ``processes`` packages are extracted at once (default: one per CPU); documents are
    assigned in package order, so the shards do not depend on it."""
    t_start = time.time()
    table = table or XL_PACKAGES
    # the manifest's row of each package it pins (every package of a rebuild)
    pinned = {p["package"]: p for p in manifest["packages"]} if manifest is not None else {}
    packages = list(packages or pinned or
                    (PACKAGE_SETS["v2"] if table is XL_PACKAGES else table))
    out = Path(out_dir)
    work = Path(workdir or tempfile.mkdtemp(prefix="ocpmx-xl-"))
    work.mkdir(parents=True, exist_ok=True)
    if any(p in FAMILIES for p in packages):
        # a rebuild's families are the members its manifest lists, not today's archive's
        packages = expand_families(packages, list(pinned) if manifest is not None else
                                   available_packages(work))
    packages = list(dict.fromkeys(packages))  # a name listed twice is one package
    if manifest is not None:
        asked = dict(seed=seed, val_fraction=val_fraction, min_chars=min_chars,
                     n_train_shards=n_train_shards)
        differ = {k: (v, manifest[k]) for k, v in asked.items() if manifest.get(k, v) != v}
        if differ:
            raise ValueError("a rebuild of a manifest takes its options; these differ "
                             f"(asked, manifest): {differ}")
        missing = [p for p in packages if p not in pinned]
        if missing:
            raise ValueError(f"packages not in the manifest being rebuilt: {missing}")
    else:
        unknown = [p for p in packages if p not in table and family_of(p) is None]
        if unknown:
            raise ValueError(f"packages without extraction rules: {unknown}")
    out.mkdir(parents=True, exist_ok=True)
    buckets_dir = work / "buckets"
    if buckets_dir.exists():
        shutil.rmtree(buckets_dir)
    buckets_dir.mkdir()
    names = [f"train{i:05d}" for i in range(n_train_shards)] + ["validation"]
    bucket = {n: open(buckets_dir / f"{n}.jsonl", "w", encoding="utf-8") for n in names}
    seen: set[bytes] = set()
    rows, t_fetch = [], time.time()
    debs = fetch_debs(packages, work, {p: row["version"] for p, row in pinned.items()})
    t_fetch = time.time() - t_fetch
    plan = {}  # package -> (category, rules, family)
    for pkg in packages:
        if pkg in pinned:
            row = pinned[pkg]
            plan[pkg] = (row["category"], [tuple(r) for r in row["rules"]], row.get("family"))
        elif pkg in table:
            plan[pkg] = (*table[pkg], None)
        else:
            family = family_of(pkg)
            plan[pkg] = (*FAMILIES[family], family)
    jobs = [(work, pkg, debs[pkg], pinned[pkg]["deb_sha256"] if pkg in pinned else None,
             plan[pkg][1], min_chars) for pkg in packages]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    processes = processes or os.cpu_count() or 1
    # a worker that dies (killed, out of memory) raises BrokenProcessPool here, not a hang
    pool = ProcessPoolExecutor(processes, mp_context=mp.get_context("fork")) \
        if processes > 1 else None
    try:
        results = pool.map(_package_job, jobs) if pool else map(_package_job, jobs)
        for pkg, (sha, version, cache) in zip(packages, results):
            deb = debs[pkg]
            category, rules, family = plan[pkg]
            if cache is None:
                raise RuntimeError(f"{deb.name}: SHA-256 {sha} differs from the manifest's "
                                   f"{pinned[pkg]['deb_sha256']}")
            n_files, docs = _read_cache(cache)
            text_hash, kept, chars, dups = hashlib.sha256(), 0, 0, 0
            for d in docs:
                digest = hashlib.sha256(d.encode()).digest()[:16]
                if digest in seen:
                    dups += 1
                    continue
                seen.add(digest)
                text_hash.update(digest)
                k = _key(d, seed)
                name = "validation" if k % 1_000_000 < val_fraction * 1_000_000 else \
                    names[(k >> 20) % n_train_shards]
                bucket[name].write(json.dumps({"text": d}) + "\n")
                kept += 1
                chars += len(d)
            # (a package all of whose documents others had is fine; so is a family's member
            # without any)
            if kept == 0 and dups == 0 and family is None:
                if pinned.get(pkg, {}).get("documents") != 0:
                    raise RuntimeError(
                        f"{pkg}: no document from {deb.name} ({n_files} texts of at least "
                        f"{min_chars} characters before cleaning): no file matches its rules "
                        f"{rules}, or none has enough text")
                log(f"warning: {pkg}: no document, as in the manifest being rebuilt")
            row = {"package": pkg, "version": version, "category": category,
                   "deb": deb.name, "deb_sha256": sha, "deb_bytes": deb.stat().st_size,
                   "rules": [list(r) for r in rules], "extracted_documents": n_files,
                   "documents": kept, "duplicates_dropped": dups, "characters": chars,
                   "text_sha256": text_hash.hexdigest()}
            if family is not None:
                row["family"] = family
            rows.append(row)
            if family is None or kept:
                log(f"{pkg} {version}: {kept} documents, {chars / 1e6:.1f} M characters")
    finally:
        if pool:
            pool.shutdown(wait=False, cancel_futures=True)
    for f in bucket.values():
        f.close()
    shards, totals = [], Counter()
    for i, n in enumerate(names):
        with open(buckets_dir / f"{n}.jsonl", encoding="utf-8") as f:
            docs = [json.loads(l)["text"] for l in f]
        random.Random(seed * 1_000_003 + i).shuffle(docs)
        split = "validation" if n == "validation" else "train"
        path = out / ("c4-validation.00000-of-00001.json.gz" if split == "validation" else
                      f"c4-train.{i:05d}-of-{n_train_shards:05d}.json.gz")
        write_shard(path, docs)
        totals[f"{split}_documents"] += len(docs)
        totals[f"{split}_characters"] += sum(map(len, docs))
        shards.append({"file": path.name, "documents": len(docs),
                       "characters": sum(map(len, docs)), "sha256": _sha256_file(path),
                       "bytes": path.stat().st_size})
    shutil.rmtree(buckets_dir)
    if not keep_work and workdir is None:
        shutil.rmtree(work)
    by_cat = Counter()
    for r in rows:
        by_cat[r["category"]] += r["characters"]
    info = {"source": "debian-xl", "seed": seed, "val_fraction": val_fraction,
            "min_chars": min_chars, "n_train_shards": n_train_shards,
            "apt_components": list(COMPONENTS), "tools": tool_versions(),
            "documents": totals["train_documents"] + totals["validation_documents"],
            "characters": sum(r["characters"] for r in rows),
            "characters_by_category": dict(by_cat), **dict(totals),
            "build_seconds": round(time.time() - t_start, 1),
            "download_seconds": round(t_fetch, 1),
            "download_bytes": sum(r["deb_bytes"] for r in rows),
            "packages": rows, "shards": shards}
    (out / "MANIFEST.json").write_text(json.dumps(info, indent=1))
    (out / "CORPUS.json").write_text(json.dumps(
        {k: v for k, v in info.items() if k not in ("packages", "shards")} |
        {"packages": [r["package"] for r in rows], "shuffled": True}, indent=1))
    return info

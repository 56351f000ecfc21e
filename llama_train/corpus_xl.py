"""The ablation's v2 corpus (``ocpmx data build-corpus --source debian-xl``): enough unique,
mostly natural-language text that a run of several hundred million tokens never sees a token
twice, built offline and reproducibly from packages that Debian's archive serves by name.

What goes in (``XL_PACKAGES`` in ``corpus_xl_packages``, one table: package -> (category,
[(file glob, kind)]); a module of its own so that the extraction cache, keyed by this module's
code, survives a change of the table):
* ``rfc``: the IETF RFCs (``doc-rfc-*``, Debian's non-free component), their plain-text
  editions with the page headers, footers and dot leaders removed;
* ``manual``: TeX Live's package manuals (the PDFs, through ``pdftotext``), HTML manuals of
  large projects (Erlang/OTP, the JDK, pandas, SciPy, statsmodels, scikit-learn, SageMath,
  Django, Rust, Racket, Qt, ...), GNU info manuals (GCC, GDB, glibc, gawk, make, Bison, Emacs),
  man pages, the Debian Administrator's Handbook, the v1 set (Linux and Python docs, Perl, git,
  PostgreSQL);
* ``dictionary``: GCIDE, WordNet, the Jargon File, FOLDOC, the Devil's Dictionary;
* ``comments``: the comments of the Linux kernel's and GCC's C sources (natural language about
  code; a minority of the corpus, listed separately in the manifest).

Every document is cleaned (whitespace, boilerplate lines that recur across a package's
documents), filtered (at least ``min_chars`` characters, mostly letters), de-duplicated across
the whole corpus (SHA-256 of the text), then assigned by a seeded hash of its text to the
validation split (``val_fraction``) or to one of ``n_train_shards`` training shards, and shuffled
within its shard. Training shards are thus uniform random samples of the corpus: any subset of
them is one too, and validation is drawn across the whole corpus.

``MANIFEST.json`` (written to OUT, committed as results/ablation_v2/corpus_manifest.json) lists
every package with its version, the SHA-256 of its .deb, its documents, characters and the
SHA-256 of its extracted text, the tools' versions and the shards' SHA-256. Given a manifest,
``build(..., manifest=...)`` downloads exactly those versions (``apt-get download name=version``)
and fails if a .deb's hash differs.

Needs apt-get and dpkg (a Debian or Ubuntu machine; nothing is installed, packages are unpacked
with ``dpkg -x``) and ``pdftotext`` (``apt-get install poppler-utils``) for the PDF manuals.
"""
from __future__ import annotations

import ast
import gzip
import hashlib
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tokenize
import unicodedata
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

from .corpus import CHUNK, _read, chunks, html_text
from .corpus_xl_packages import COMPONENTS, FAMILIES, FAMILY_EXCLUDED, XL_PACKAGES
from .data import write_shard


# ---- text extraction, one function per kind: (path) -> list of documents ----------------------

def normalize(text: str) -> str:
    """Trailing spaces stripped, tabs expanded, runs of blank lines cut to one, NUL and other
    control characters (form feeds included) removed."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").expandtabs(8)
    text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", text)
    lines = [l.rstrip() for l in text.split("\n")]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


_RFC_FOOTER = re.compile(r"^\S.*\[Page [0-9ivxlc]+\]\s*$", re.IGNORECASE)
_RFC_HEADER = re.compile(r"^(RFC|Internet-Draft|INTERNET-DRAFT) .*\b(19|20)\d\d\s*$")


def rfc_text(text: str) -> str:
    """An RFC's plain text without its pagination: page footers ('Author  Category  [Page 3]'),
    running headers ('RFC 3411  Title  December 2002') after form feeds, dot leaders of the table
    of contents, and the three-space indentation of the body."""
    out = []
    after_break = False
    for line in text.replace("\r", "").split("\n"):
        if "\f" in line:
            after_break = True
            line = line.replace("\f", "")
        if _RFC_FOOTER.match(line):
            after_break = True
            continue
        if after_break and _RFC_HEADER.match(line):
            after_break = False
            continue
        if line.strip():
            after_break = False
        line = re.sub(r"\s?\.{4,}\s?", " ", line)
        out.append(line[3:] if line.startswith("   ") else line)
    return normalize("\n".join(out))


def pdf_text(path: Path) -> str:
    """The text of a PDF through poppler's pdftotext (reading order), Unicode NFKC (ligatures
    such as 'ﬁ' become 'fi'), words hyphenated at line ends joined."""
    done = subprocess.run(["pdftotext", "-q", "-enc", "UTF-8", "-nopgbrk", str(path), "-"],
                          capture_output=True, timeout=300)
    text = unicodedata.normalize("NFKC", done.stdout.decode("utf-8", "replace"))
    text = re.sub(r"(\w)-\n(\w)", r"\1\2", text)
    return normalize(text)


_ROFF_ESC = [(re.compile(r"\\f(\[[^\]]*\]|\(..|.)"), ""), (re.compile(r"\\\((..)"), ""),
             (re.compile(r"\\\[[^\]]*\]"), ""), (re.compile(r"\\[s][+-]?\d"), ""),
             (re.compile(r"\\[&|^%:]"), ""), (re.compile(r"\\[-e]"), "-"),
             (re.compile(r"\\ "), " "), (re.compile(r"\\\*(\(..|\[[^\]]*\]|.)"), "")]
_ROFF_TEXT_MACROS = {"SH", "SS", "B", "I", "BR", "IR", "RB", "RI", "BI", "IB", "SM", "TH", "IP",
                     "TP", "Nm", "Nd", "Sh", "Ss", "Fn", "Fa", "Ar", "Pa", "Xr", "Dv", "Er",
                     "Ev", "Fl", "Va", "Li", "Em", "Sy", "Cm", "Ic", "Dq", "Qq", "Sq", "Pq"}


def man_text(roff: str) -> str:
    """A man page's text from its roff source: macro lines kept for their words (section titles,
    bold and italic runs), requests dropped, escapes removed; approximate, as a reader sees it."""
    out = []
    for line in roff.split("\n"):
        if line.startswith(('.\\"', "'\\\"", '.\\\'')):
            continue
        if line.startswith((".", "'")):
            parts = line[1:].split(None, 1)
            if not parts:
                continue
            macro, rest = parts[0], parts[1] if len(parts) > 1 else ""
            if macro in ("SH", "SS", "Sh", "Ss"):
                out.append("")
            if macro in _ROFF_TEXT_MACROS and rest:
                line = rest.replace('"', "")
            elif macro in ("PP", "LP", "P", "sp", "br", "Pp"):
                out.append("")
                continue
            else:
                continue
        for pat, rep in _ROFF_ESC:
            line = pat.sub(rep, line)
        out.append(line.replace("\\\\", "\\"))
    return normalize("\n".join(out))


def info_documents(text: str, size: int = CHUNK) -> list[str]:
    """A GNU info file cut at its nodes (0x1f separators, the 'File: ..., Node: ...' line
    dropped) into documents of about ``size`` characters."""
    nodes = []
    for node in text.split("\x1f"):
        lines = node.lstrip("\n").split("\n")
        if lines and lines[0].startswith(("File:", "Tag Table:", "End Tag Table", "Indirect:")):
            if not lines[0].startswith("File:"):
                continue
            lines = lines[1:]
        nodes.append("\n".join(lines))
    return chunks(normalize("\n\n".join(nodes)), size)


_C_COMMENT = re.compile(r"/\*(.*?)\*/|//([^\n]*)", re.DOTALL)
_C_SOURCES = (".c", ".h", ".cc", ".cpp", ".cxx", ".hh", ".def")


def c_comments(source: str) -> str:
    """The comments of a C/C++ source, block by block (leading '*' of block comments removed);
    string literals are not parsed, so '//' inside a string may start a false comment (rare)."""
    blocks = []
    for m in _C_COMMENT.finditer(source):
        body = m.group(1) if m.group(1) is not None else m.group(2)
        lines = [re.sub(r"^\s*\*+ ?", "", l).rstrip() for l in body.split("\n")]
        block = "\n".join(lines).strip()
        if block and re.search(r"[A-Za-z]{3}", block):
            blocks.append(block)
    return normalize("\n\n".join(blocks))


def tar_comment_documents(path: Path, min_chars: int) -> list[str]:
    """One document per C/C++ source file of a source tarball (its comments), in archive order."""
    docs = []
    with tarfile.open(path, "r:*") as tar:
        for m in tar:
            if not (m.isfile() and m.name.endswith(_C_SOURCES)) or m.size > 4_000_000:
                continue
            f = tar.extractfile(m)
            text = c_comments(f.read().decode("utf-8", "replace"))
            if len(text) >= min_chars:
                docs.append(text)
    return docs


# ---- source code of the v3 families: comments and docstrings ---------------------------------

# a comment block that carries a licence or copyright notice: such blocks head thousands of files
# in the same words, so they are dropped (v3's kinds only; c_comments keeps v2 as it was built)
_LICENSE = re.compile(r"(?i)copyright|spdx-license|licen[cs]ed under|permission is hereby granted|"
                      r"is free software|all rights reserved")
# strings first, so that a '//' or '/*' inside one (a URL) starts no comment; then block
# comments (not nested) and line comments ('//', '///', '//!')
_CODE = {lang: re.compile(strings + r"|(?P<block>/\*.*?\*/)|(?P<line>//[^\n]*)", re.DOTALL)
         for lang, strings in (
             ("go", r'"(?:\\.|[^"\\\n])*"|`[^`]*`|\'(?:\\[^\'\n]{1,10}|[^\'\\\n])\''),
             ("rust", r'"(?:\\.|[^"\\])*"|\'(?:\\[^\'\n]{1,10}|[^\'\\\n])\''))}
_DIRECTIVE = re.compile(r"(go:|\+build|nolint|#\[|-\*-|vim?:|type:|noqa|pragma|pylint|!)")
_MAX_SOURCE = 4_000_000  # bytes: larger source files are generated tables, not prose


def _comment_text(blocks) -> str:
    kept = [b for b in blocks if re.search(r"[A-Za-z]{3}", b) and not _LICENSE.search(b)]
    return normalize("\n\n".join(kept))


def code_comments(source: str, lang: str) -> str:
    """The comments of a Go (``lang`` 'go') or Rust ('rust') source, block by block: string
    literals skipped, consecutive line comments joined into one block, the '*' that starts a
    line of a block comment removed; directives ('//go:build') and licence blocks dropped."""
    blocks, run, run_end = [], [], -1
    for m in _CODE[lang].finditer(source):
        if m.group("line") is not None:
            text = re.sub(r"^//[/!]?", "", m.group("line")).strip()
            if _DIRECTIVE.match(text):
                continue
            if run and source.count("\n", run_end, m.start()) > 1:
                blocks.append("\n".join(run))
                run = []
            run.append(text)
            run_end = m.end()
        elif m.group("block") is not None:
            if run:
                blocks.append("\n".join(run))
                run = []
            body = m.group("block")[2:-2].lstrip("*!")
            lines = [re.sub(r"^\s*\*+ ?", "", l).rstrip() for l in body.split("\n")]
            blocks.append("\n".join(lines).strip())
    if run:
        blocks.append("\n".join(run))
    return _comment_text(blocks)


def python_docs(source: str) -> str:
    """A Python source's docstrings (module, classes, functions) and comments (consecutive comment
    lines as one block), in source order; directives (coding, noqa, type:) and licence blocks
    dropped. A file that does not parse (Python 2) gives its comments alone."""
    items = []
    try:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    items.append((node.body[0].lineno, doc))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        pass
    run, last = [], -2
    try:
        for t in tokenize.generate_tokens(io.StringIO(source).readline):
            if t.type != tokenize.COMMENT:
                continue
            text = t.string.lstrip("#").strip()
            if _DIRECTIVE.match(text) or "coding" in text[:20]:
                continue
            if run and t.start[0] != last + 1:
                items.append((run[0][0], "\n".join(x for _, x in run)))
                run = []
            run.append((t.start[0], text))
            last = t.start[0]
    except (tokenize.TokenError, SyntaxError, ValueError):
        pass
    if run:
        items.append((run[0][0], "\n".join(x for _, x in run)))
    return _comment_text(b for _, b in sorted(items, key=lambda i: i[0]))


def file_documents(path: Path, kind: str, min_chars: int = 200) -> list[str]:
    """The documents of one file of kind ``kind``."""
    if kind == "pdf":
        texts = [pdf_text(path)]
    elif kind == "c_comments_tar":
        return tar_comment_documents(path, min_chars)
    elif kind in ("go_comments", "rust_comments", "python_docs"):
        if path.stat().st_size > _MAX_SOURCE:
            return []
        raw = path.read_bytes().decode("utf-8", "replace")
        texts = [python_docs(raw) if kind == "python_docs" else
                 code_comments(raw, kind.split("_")[0])]
    else:
        raw = _read(path)
        if kind == "html":
            texts = [normalize(html_text(raw))]
        elif kind == "rfc":
            texts = [rfc_text(raw)]
        elif kind == "man":
            texts = [man_text(raw)]
        elif kind == "info":
            texts = info_documents(raw)
        elif kind == "chunks":
            texts = chunks(normalize(raw))
        elif kind == "text":
            texts = [normalize(raw)]
        else:
            raise ValueError(f"unknown document kind {kind!r}")
    return [t for t in texts if len(t) >= min_chars]


def _file_job(args):
    path, kind, min_chars = args
    try:
        return file_documents(Path(path), kind, min_chars)
    except (subprocess.TimeoutExpired, OSError, EOFError, tarfile.TarError, UnicodeError):
        return []


# ---- filters -------------------------------------------------------------------------------------

_SPACE = re.compile(r"\s")
_LETTER = re.compile(r"[^\W\d_]")


def mostly_words(doc: str, min_letters: float = 0.6) -> bool:
    """Natural-language check: letters are at least ``min_letters`` of the non-space
    characters (drops tables of numbers, hex dumps, typeset-glyph garbage from PDFs)."""
    visible = len(doc) - _SPACE.subn("", doc)[1]
    return visible > 0 and _LETTER.subn("", doc)[1] >= min_letters * visible


def drop_boilerplate(docs: list[str], min_docs: int = 20, share: float = 0.02,
                     min_len: int = 12) -> list[str]:
    """Remove the lines that recur across a package's documents (navigation bars, licence and
    copyright paragraphs, running titles): a line of at least ``min_len`` characters found in at
    least max(min_docs, share x documents) documents. Short lines (code braces) stay."""
    if len(docs) < min_docs:
        return docs
    seen: Counter = Counter()
    for d in docs:
        seen.update({hash(l.strip()) for l in d.split("\n") if len(l.strip()) >= min_len})
    limit = max(min_docs, share * len(docs))
    common = {h for h, n in seen.items() if n >= limit}
    if not common:
        return docs
    out = []
    for d in docs:
        kept = [l for l in d.split("\n") if len(l.strip()) < min_len or hash(l.strip()) not in common]
        out.append(normalize("\n".join(kept)))
    return out


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
    return ["apt-get", f"-oDir::Etc::SourceList={src}", "-oDir::Etc::SourceParts=/nonexistent",
            f"-oDir::State::Lists={lists}", f"-oDir::Cache={work / 'cache'}"]


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


def _download(uri: str, dest: Path, size: int, sha256: str, tries: int = 4) -> None:
    """``uri`` into ``dest`` (a temporary name, then a rename), checked against the size and
    SHA-256 the archive's signed package lists give (what apt-get itself checks); a failed or
    differing transfer is tried again (``tries`` in all, 1, 2, 4 s apart)."""
    import urllib.request
    tmp = dest.with_name(dest.name + ".part")
    for attempt in range(tries):
        problem = None
        try:
            h = hashlib.sha256()
            with urllib.request.urlopen(uri, timeout=120) as r, open(tmp, "wb") as f:
                for block in iter(lambda: r.read(1 << 20), b""):
                    h.update(block)
                    f.write(block)
            if tmp.stat().st_size != size or h.hexdigest() != sha256:
                problem = "size or SHA-256 differs from the package lists'"
        except OSError as e:  # URLError, timeouts, resets
            problem = f"{type(e).__name__}: {e}"
        if problem is None:
            os.replace(tmp, dest)
            return
        tmp.unlink(missing_ok=True)
        if attempt < tries - 1:
            time.sleep(2 ** attempt)
    raise RuntimeError(f"{uri}: {problem} ({tries} tries)")


def fetch_debs(packages, work: Path, pins: dict[str, str] | None = None,
               batch: int = 500, connections: int = 8) -> dict[str, Path]:
    """{package: its .deb in work/debs}, ``name=version`` where ``pins`` names a version; .debs
    already there are reused. apt-get resolves the names (``download --print-uris``, ``batch``
    names a call; a batch that fails is retried name by name, so that the error names the
    package) and each .deb comes over one of ``connections`` at once, checked against the
    size and SHA-256 that the archive's signed lists give (thousands of small packages: one
    apt-get call each would take hours)."""
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"source 'debian-xl' needs {tool} (a Debian or Ubuntu machine)")
    pins = pins or {}
    debs = work / "debs"
    debs.mkdir(parents=True, exist_ok=True)

    def wanted(p, have):
        return [d for d in have.get(p, []) if p not in pins or _file_version(d) == pins[p]]

    have = _debs_by_name(debs)
    missing = [p for p in packages if not wanted(p, have)]
    if missing:
        apt = _apt(work)
        subprocess.run(apt + ["update"], check=True, capture_output=True)
        names = [f"{p}={pins[p]}" if p in pins else p for p in missing]
        uris = []
        for i in range(0, len(names), batch):
            part = names[i:i + batch]
            done = subprocess.run(apt + ["download", "--print-uris", *part], capture_output=True,
                                  text=True)
            lines = done.stdout.splitlines()
            if done.returncode:
                lines = []
                for name in part:
                    one = subprocess.run(apt + ["download", "--print-uris", name],
                                         capture_output=True, text=True)
                    if one.returncode:
                        raise RuntimeError(f"apt-get download {name} failed: "
                                           f"{one.stderr.strip()}")
                    lines += one.stdout.splitlines()
            for line in lines:
                m = re.match(r"'(\S+)' (\S+) (\d+) SHA256:([0-9a-f]{64})", line)
                if m:
                    uris.append((m.group(1), debs / m.group(2), int(m.group(3)), m.group(4)))
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(connections) as pool:
            list(pool.map(lambda u: _download(*u), uris))
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


def tool_versions() -> dict:
    v = {"python": sys.version.split()[0]}
    if shutil.which("pdftotext"):
        done = subprocess.run(["pdftotext", "-v"], capture_output=True, text=True)
        v["pdftotext"] = (done.stderr or done.stdout).splitlines()[0].strip()
    return v


# ---- the build --------------------------------------------------------------------------------

def package_documents(root: Path, rules, min_chars: int = 200, processes: int | None = None):
    """The documents of an unpacked package under ``root``, in file order (sorted paths)."""
    jobs = []
    for pattern, kind in rules:
        for f in sorted(root.glob(pattern)):
            if f.is_file() and not f.is_symlink():
                jobs.append((str(f), kind, min_chars))
    if kind_needs_pdftotext(rules) and shutil.which("pdftotext") is None:
        raise RuntimeError("the PDF manuals need pdftotext: apt-get install poppler-utils")
    processes = processes or os.cpu_count() or 1
    if processes > 1 and len(jobs) > 8:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(processes) as pool:
            parts = pool.map(_file_job, jobs, chunksize=4)
    else:
        parts = [_file_job(j) for j in jobs]
    return [d for p in parts for d in p]


def kind_needs_pdftotext(rules) -> bool:
    return any(kind == "pdf" for _, kind in rules)


def _extractor_hash() -> str:
    """SHA-256 of the extraction code (this module and corpus.py): a cached package's
    documents are reused only by the code that made them."""
    h = hashlib.sha256()
    for f in (Path(__file__), Path(__file__).with_name("corpus.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _extracted(work: Path, pkg: str, deb: Path, sha: str, rules, min_chars: int,
               processes: int | None = None):
    """(files' document count, cleaned and filtered documents) of one package: unpacked and
    extracted (the slow part: PDFs, HTML), or read back from ``work/docs`` where the same .deb
    was extracted by the same code and rules before, so that an interrupted build resumes
    package by package. The cache file is written atomically (a temporary name, then a
    rename)."""
    rules_hash = hashlib.sha256(json.dumps([list(r) for r in rules]).encode()).hexdigest()[:8]
    cache = work / "docs" / f"{pkg}_{sha[:16]}_{min_chars}_{rules_hash}_{_extractor_hash()}.json.gz"
    if cache.exists():
        with gzip.open(cache, "rt", encoding="utf-8") as f:
            c = json.load(f)
        return c["extracted_documents"], c["documents"]
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
    return n_files, docs


def _package_job(args):
    """One package in a worker of the build's pool: (SHA-256 of its .deb, version, extracted
    texts, documents); the documents are None where the .deb's hash differs from ``want``."""
    work, pkg, deb, want, rules, min_chars = args
    sha = _sha256_file(deb)
    if want is not None and sha != want:
        return sha, None, 0, None
    n_files, docs = _extracted(work, pkg, deb, sha, rules, min_chars, processes=1)
    return sha, _deb_version(deb), n_files, docs


def _key(text: str, seed: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}\0{text}".encode()).digest()[:8], "little")


def build(out_dir, packages=None, table=None, n_train_shards: int = 32,
          val_fraction: float = 0.01, seed: int = 0, min_chars: int = 200, workdir=None,
          manifest: dict | None = None, keep_work: bool = True, log=print,
          processes: int | None = None) -> dict:
    """Build the corpus in ``out_dir`` (C4 layout: c4-train.NNNNN-of-NNNNN.json.gz,
    c4-validation.00000-of-00001.json.gz, MANIFEST.json, CORPUS.json); returns the manifest.

    ``packages``: names from ``table`` (default ``XL_PACKAGES``), all by default; ``manifest``:
    a previous build's manifest, rebuilt as it was: its packages in its order (by default; a
    name it lacks is an error), its versions (the .deb hashes must match), its categories and
    extraction rules (not the table's later ones), and its seed, split and minimum length (an
    argument that differs is an error). A package that gives no document (no file matches its
    rules, or none has enough text: a glob is wrong, or the package's layout changed) is an
    error, except in a rebuild of a manifest that records it so (then a warning).
    ``workdir`` keeps the downloads and each package's extracted documents (both reused by a
    later build: an interrupted build resumes where it stopped) and the temporary buckets.
    ``packages`` may name families (keys of ``FAMILIES``): each stands for the archive's packages
    it matches (``expand_families``); a family's member may give no document. ``processes``
    packages are extracted at once (default: one per CPU); documents are assigned in package
    order, so the shards do not depend on it."""
    t_start = time.time()
    table = table or XL_PACKAGES
    # the manifest's row of each package it pins (every package of a rebuild)
    pinned = {p["package"]: p for p in manifest["packages"]} if manifest is not None else {}
    packages = list(packages or pinned or table)
    out = Path(out_dir)
    work = Path(workdir or tempfile.mkdtemp(prefix="ocpmx-xl-"))
    work.mkdir(parents=True, exist_ok=True)
    if any(p in FAMILIES for p in packages):
        packages = expand_families(packages, available_packages(work))
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
    processes = processes or os.cpu_count() or 1
    pool = mp.get_context("fork").Pool(processes) if processes > 1 else None
    try:
        results = pool.imap(_package_job, jobs) if pool else map(_package_job, jobs)
        for pkg, (sha, version, n_files, docs) in zip(packages, results):
            deb = debs[pkg]
            category, rules, family = plan[pkg]
            if docs is None:
                raise RuntimeError(f"{deb.name}: SHA-256 {sha} differs from the manifest's "
                                   f"{pinned[pkg]['deb_sha256']}")
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
            pool.terminate()
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

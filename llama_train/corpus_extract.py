"""Text extraction for the debian-xl corpora (``corpus_xl``): one function per kind of file, a
path (or a source's text) in, documents out, and the filters every document passes. Kept apart
from the fetching and building code, because its hash (with corpus.py's) keys the builder's
extraction cache: a change here extracts every package again, a change to the build does not.

Kinds (``file_documents``): ``pdf`` (pdftotext), ``html``, ``rfc``, ``man`` (roff), ``info``,
``chunks`` (dictionaries), ``text``, ``c_comments_tar`` (the C/C++ files of a source tarball;
v2), and v3's ``go_comments``, ``rust_comments``, ``python_docs``."""
from __future__ import annotations

import ast
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tokenize
import unicodedata
from collections import Counter
from pathlib import Path

from .corpus import CHUNK, _read, chunks, html_text


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
_MAX_SOURCE = 4_000_000  # bytes: larger source files are generated tables, not prose


def _unstarred(body: str) -> str:
    """A comment's lines without the '*' that starts each line of a block comment."""
    return "\n".join(re.sub(r"^\s*\*+ ?", "", l).rstrip() for l in body.split("\n")).strip()


def c_comments(source: str) -> str:
    """The comments of a C/C++ source, block by block (leading '*' of block comments removed);
    string literals are not parsed, so '//' inside a string may start a false comment (rare)."""
    blocks = []
    for m in _C_COMMENT.finditer(source):
        body = m.group(1) if m.group(1) is not None else m.group(2)
        block = _unstarred(body)
        if block and re.search(r"[A-Za-z]{3}", block):
            blocks.append(block)
    return normalize("\n\n".join(blocks))


def tar_comment_documents(path: Path, min_chars: int) -> list[str]:
    """One document per C/C++ source file of a source tarball (its comments), in archive order."""
    docs = []
    with tarfile.open(path, "r:*") as tar:
        for m in tar:
            if not (m.isfile() and m.name.endswith(_C_SOURCES)) or m.size > _MAX_SOURCE:
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
# strings first, so that a '//' or '/*' inside one (a URL) starts no comment (Rust's raw strings,
# r"..." and r#"..."#, before its plain ones: a raw string may end in a backslash or hold '"');
# then block comments (not nested; one left open runs to the end of the file) and line comments
# ('//', '///', '//!')
_CODE = {lang: re.compile(strings + r"|(?P<block>/\*.*?(?:\*/|\Z))|(?P<line>//[^\n]*)", re.DOTALL)
         for lang, strings in (
             ("go", r'"(?:\\.|[^"\\\n])*"|`[^`]*`|\'(?:\\[^\'\n]{1,10}|[^\'\\\n])\''),
             ("rust", r'(?<![\w])b?r(?P<hashes>#*)".*?"(?P=hashes)|"(?:\\.|[^"\\])*"|'
                      r'\'(?:\\[^\'\n]{1,10}|[^\'\\\n])\''))}
_DIRECTIVE = re.compile(r"(go:|\+build|nolint|#\[|-\*-|vim?:|type:|noqa|pragma|pylint|!)")
_ENCODING = re.compile(r"coding[:=]")  # PEP 263, on line 1 or 2
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
            blocks.append(_unstarred(m.group("block")[2:].removesuffix("*/").lstrip("*!")))
    if run:
        blocks.append("\n".join(run))
    return _comment_text(blocks)


def python_docs(source: str) -> str:
    """A Python source's docstrings (module, classes, functions) and comments (consecutive comment
    lines as one block), in source order; directives (the encoding line, noqa, type:) and
    licence blocks dropped. A file that does not parse (Python 2) gives its comments alone."""
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
            if _DIRECTIVE.match(text) or (t.start[0] <= 2 and _ENCODING.search(text)):
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


def tool_versions() -> dict:
    v = {"python": sys.version.split()[0]}
    if shutil.which("pdftotext"):
        done = subprocess.run(["pdftotext", "-v"], capture_output=True, text=True)
        v["pdftotext"] = (done.stderr or done.stdout).splitlines()[0].strip()
    return v


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

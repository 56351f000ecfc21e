"""The packages of the debian-xl corpora (``corpus_xl``) and how each one's text is found: one
table, package -> (category, [(file glob, kind)]), plus ``FAMILIES``, the same for every package
of Debian 12 whose name matches a regular expression; kinds: ``corpus_extract.file_documents``.
Kept apart from the extraction code, whose hash keys the extraction cache: editing this table
re-extracts only the packages whose rules changed (the cache is keyed by each package's rules
too).

Package sets: ``v2`` (the ablation's corpus, 344.5 M tokens) and ``v3`` (v2, the further manuals
and source comments measured in results/ablation_v2/CORPUS.md, five API references, and six
families: Qt 5's HTML manuals, Perl modules' man pages, Python packages' docstrings and
comments, Sphinx manuals of Python packages, Go and Rust packages' comments; issue 16's
>= 600 M tokens)."""
from __future__ import annotations

HTML = [("**/*.html", "html"), ("**/*.htm", "html"), ("**/*.html.gz", "html")]
INFO = [("**/*.info*", "info")]
RFC = [("**/rfc*.txt.gz", "rfc"), ("**/rfc*.txt", "rfc")]
PDF = [("**/*.pdf", "pdf")]
MAN = [("**/man/**/*.gz", "man")]
DICT = [("**/*.dict.dz", "chunks")]
GO = [("**/*.go", "go_comments")]
RUST = [("**/*.rs", "rust_comments")]
PYTHON = [("**/*.py", "python_docs")]
C_TARS = [("**/*.tar.*", "c_comments_tar")]

_RFC_PACKAGES = ("doc-rfc-std", "doc-rfc-std-proposed", "doc-rfc-informational",
                 "doc-rfc-experimental", "doc-rfc-fyi-bcp", "doc-rfc-old-std", "doc-rfc-others",
                 "doc-rfc-misc")
# TeX Live's pstricks and fonts-extra manuals are left out: mostly drawings and font samples
# (pstricks: 6 M characters of text from 270 MB of PDFs, and 6 minutes of pdftotext)
_TEXLIVE = ("texlive-latex-extra-doc", "texlive-pictures-doc", "texlive-publishers-doc",
            "texlive-latex-base-doc", "texlive-science-doc", "texlive-latex-recommended-doc",
            "texlive-metapost-doc", "texlive-humanities-doc")
_HTML_MANUALS = ("erlang-doc", "openjdk-17-doc", "python-pandas-doc", "python-scipy-doc",
                 "python-statsmodels-doc", "python-sklearn-doc", "sagemath-doc",
                 "python-django-doc", "debian-handbook", "rust-doc", "racket-doc",
                 "qtbase5-doc-html", "python-astropy-doc", "python-sympy-doc",
                 "python-skimage-doc", "python-biopython-doc", "twisted-doc", "gimp-help-en",
                 "cppreference-doc-en-html", "lilypond-doc-html", "installation-guide-amd64",
                 "postgresql-doc-15")
_INFO_MANUALS = ("gcc-12-doc", "gdb-doc", "glibc-doc-reference", "gawk-doc", "make-doc",
                 "bison-doc", "emacs-common-non-dfsg", "gfortran-12-doc", "cpp-12-doc")

# package -> (category, [(glob, kind)]); kinds: see EXTRACTORS
XL_PACKAGES: dict[str, tuple[str, list[tuple[str, str]]]] = {
    **{p: ("rfc", RFC) for p in _RFC_PACKAGES},
    **{p: ("manual", PDF) for p in _TEXLIVE},
    **{p: ("manual", HTML) for p in _HTML_MANUALS},
    **{p: ("manual", INFO) for p in _INFO_MANUALS},
    # the package ships its Documentation gzipped: the v2 corpus (built with the .rst/.txt
    # globs alone) got none of it; its manifest keeps those rules, so it rebuilds as it was
    "linux-doc-6.1": ("manual", [("**/Documentation/**/*.rst", "text"),
                                 ("**/Documentation/**/*.txt", "text"),
                                 ("**/Documentation/**/*.rst.gz", "text"),
                                 ("**/Documentation/**/*.txt.gz", "text")]),
    "python3.11-doc": ("manual", [("**/_sources/**/*.txt", "text")]),
    "perl-doc": ("manual", [("**/pod/*.pod", "text")]),
    "git-doc": ("manual", [("**/git-doc/*.txt", "text")]),
    "manpages": ("manual", MAN),
    "manpages-dev": ("manual", MAN),
    "manpages-posix": ("manual", MAN),
    "manpages-posix-dev": ("manual", MAN),
    "dict-gcide": ("dictionary", DICT),
    "dict-wn": ("dictionary", DICT),
    "dict-jargon": ("dictionary", DICT),
    "dict-foldoc": ("dictionary", DICT),
    "dict-devil": ("dictionary", DICT),
    "linux-source-6.1": ("comments", [("**/linux-source-*.tar.xz", "c_comments_tar")]),
    "gcc-12-source": ("comments", [("**/gcc-*.tar.*", "c_comments_tar")]),
}
_V2 = tuple(XL_PACKAGES)

# v3's named packages (results/ablation_v2/CORPUS.md measured each; left out: rust-web-doc, 57%
# of whose text rust-doc already has, libstdc++-12-doc, a Doxygen dump with 17% prose, and
# openjdk-17-source, whose sources sit in a zip)
_V3_HTML = ("libboost1.74-doc", "libreoffice-help-en-us", "r-doc-html", "exim4-doc-html",
            "coq-doc-html",
            # API references: templated, less prose (0.16-0.61), but text no other package has
            "scala-doc", "petsc3.18-doc", "pacemaker-doc", "sumo-doc", "vtk9-doc")
# TeX Live collections that ship their manuals (PDF) inside the package itself
_V3_TEXLIVE = ("texlive-lang-english", "texlive-bibtex-extra", "texlive-music", "texlive-games",
               "texlive-plain-generic", "texlive-luatex")
XL_PACKAGES.update({
    **{p: ("manual", HTML) for p in _V3_HTML},
    **{p: ("manual", PDF) for p in _V3_TEXLIVE},
    # GHC's manuals and library references, not the hyperlinked sources (libraries/*/src/)
    "ghc-doc": ("manual", [("**/users_guide/**/*.html", "html"),
                           ("**/libraries/*/*.html", "html")]),
    "gnome-user-docs": ("manual", [("**/help/C/**/*.page", "html")]),  # Mallard XML
    "golang-1.19-src": ("comments", GO),
    "rust-src": ("comments", RUST),
    **{p: ("comments", C_TARS) for p in ("glibc-source", "binutils-source", "gdb-source")},
})

# package families: a regular expression over the archive's package names (the whole name) ->
# (category, rules). A member may give no document (a Python package of compiled code, a Perl
# module without a man page); a named package may not. A name that the table names keeps the
# table's rules.
FAMILIES: dict[str, tuple[str, list[tuple[str, str]]]] = {
    r"qt.+5-doc-html|qbs-doc-html": ("manual", HTML),
    r"python-.+-doc": ("manual", HTML),
    r"lib.+-perl": ("manual", MAN),
    r"python3-.+(?<!-dbg)": ("comments", PYTHON),
    r"golang-.+-dev": ("comments", GO),
    r"librust-.+-dev": ("comments", RUST),
}

# left out of the families: generated cloud SDKs (0.14-0.53 GB of code each; their comments are
# the services' API references, templated and repeated by the million)
FAMILY_EXCLUDED = frozenset({"python3-azure", "golang-github-azure-azure-sdk-for-go-dev",
                             "golang-github-aws-aws-sdk-go-dev",
                             "golang-github-aws-aws-sdk-go-v2-dev", "golang-google-api-dev"})

PACKAGE_SETS = {"v2": _V2,
                "v3": _V2 + tuple(p for p in XL_PACKAGES if p not in _V2) + tuple(FAMILIES)}
COMPONENTS = ("main", "contrib", "non-free")  # the doc-rfc-* and GNU manuals are non-free

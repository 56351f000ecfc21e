"""The packages of the v2 corpus (``corpus_xl``) and how each one's text is found: one table,
package -> (category, [(file glob, kind)]); kinds: ``corpus_xl.file_documents``. Kept apart from
the extraction code, whose hash keys the extraction cache: editing this table re-extracts
only the packages whose rules changed (the cache is keyed by each package's rules too)."""
from __future__ import annotations

HTML = [("**/*.html", "html"), ("**/*.htm", "html"), ("**/*.html.gz", "html")]
INFO = [("**/*.info*", "info")]
RFC = [("**/rfc*.txt.gz", "rfc"), ("**/rfc*.txt", "rfc")]
PDF = [("**/*.pdf", "pdf")]
MAN = [("**/man/**/*.gz", "man")]
DICT = [("**/*.dict.dz", "chunks")]

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
PACKAGE_SETS = {"v2": tuple(XL_PACKAGES)}
COMPONENTS = ("main", "contrib", "non-free")  # the doc-rfc-* and GNU manuals are non-free

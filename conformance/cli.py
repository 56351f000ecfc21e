"""``ocpmx conform``: run the suite on one backend, print a summary and a table, write a JSON
and a Markdown report.

Verdict and exit status: 'conformant' (every check passed) 0; 'conformant with documented
deviations' (known deviations only) 0, or 4 with --strict; 'not conformant': 1 when a check
failed, 3 when a check raised an error. Bad arguments (an unknown backend, an unwritable
--report path, an invalid --deviations file) exit 2 with one line, before any check runs.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

EXIT = {"pass": 0, "deviation": 0, "fail": 1, "error": 3}
# the suite's sections (``suite.SECTIONS``), named here so that building the parser stays light
OPS = ("cast", "quantize", "dequantize", "layout", "gemm")


def add_parser(sub) -> None:
    from ..cli import format_name
    from ..spec import FORMATS
    c = sub.add_parser("conform", help="check a backend bit for bit against the emulator",
                       description=__doc__.split("\n\n")[1].replace("\n", " "))
    c.add_argument("--backend", required=True,
                   help="the backend to check (required): emulator, triton, torch, ml_dtypes, "
                        "torchao, gfloat, an entry point of ocpmx.backends, or "
                        "path/to/file.py:ClassName / module:ClassName")
    c.add_argument("--device",
                   help="triton only: cuda (the default when a GPU is present) or cpu (Triton's "
                        "interpreter)")
    c.add_argument("--formats", nargs="+", default=list(FORMATS), type=format_name,
                   metavar="FORMAT",
                   help=f"element formats to check, by name, alias or dtype name (default: all: "
                        f"{' '.join(FORMATS)})")
    c.add_argument("--ops", nargs="+", default=None, choices=OPS,
                   help=f"operations to check (default: all: {' '.join(OPS)})")
    c.add_argument("--budget", default="quick", choices=["quick", "full"],
                   help="quick (default: 8 Hypothesis examples per theme) or full (60 examples "
                        "and every one of the 2^32 float32 inputs)")
    c.add_argument("--no-shrink", action="store_true",
                   help="report the first failing example Hypothesis finds instead of shrinking "
                        "it to a minimal one (quicker where the backend is slow)")
    c.add_argument("--report", metavar="PATH",
                   help="write the JSON report here and the Markdown report beside it (.md); "
                        "checked before the suite runs (default: print only)")
    c.add_argument("--deviations", metavar="FILE",
                   help="your own known deviations (the schema of conformance/deviations/*.json), "
                        "added to the backend's built-in ones (default: the built-in ones only)")
    c.add_argument("--strict", action="store_true",
                   help="exit 4 when known deviations occur (default: they exit 0)")
    c.set_defaults(func=cmd_conform)


def report_path_problem(report: str) -> str | None:
    """Why the JSON report (and the .md beside it) could not be written, or None. Creates the
    directory if it is missing (it would be created at the end anyway)."""
    path = Path(report)
    if path.suffix == ".md":
        return f"--report {report}: name the JSON file; the Markdown report goes beside it (.md)"
    if path.is_dir():
        return f"--report {report} is a directory; name the JSON file to write"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return f"--report {report}: cannot create the directory {path.parent}: {e.strerror or e}"
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".ocpmx-conform-"):
            pass
    except OSError as e:
        return f"--report {report}: cannot write in {path.parent}: {e.strerror or e}"
    for p in (path, path.with_suffix(".md")):
        if p.exists() and (p.is_dir() or not os.access(p, os.W_OK)):
            return f"--report {report}: cannot overwrite {p}"
    return None


def cmd_conform(args) -> int:
    def fail(message: str) -> int:
        print(f"ocpmx conform: error: {message}", file=sys.stderr)
        return 2

    args.formats = list(dict.fromkeys(args.formats))  # 'mxfp4 e2m1' names one format
    if args.report:  # before anything slow: a bad path must not cost a whole run
        problem = report_path_problem(args.report)
        if problem:
            return fail(problem)
    from .backends import BUILTIN, TritonBackend
    triton_backend = issubclass(BUILTIN.get(args.backend, object), TritonBackend)
    if triton_backend and args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
    from .backends import load_backend
    from .suite import (SPEC_VERSION, builtin_deviations_paths, counts_text, header_text,
                        load_deviation_file, run_suite, suite_commit, summary_matrix, to_json,
                        to_markdown, to_table, verdict)
    kwargs = {"device": args.device} if args.device and triton_backend else {}
    try:
        backend = load_backend(args.backend, **kwargs)
    except (LookupError, RuntimeError) as e:
        return fail(str(e))
    extra = []
    if args.deviations:
        try:
            extra = load_deviation_file(args.deviations, backend.name)
        except ValueError as e:
            return fail(str(e))
    from .. import __version__
    builtin = builtin_deviations_paths(backend)
    sources = [" + ".join(f"built-in {p.parent.name}/{p.name}" for p in builtin)
               or "none built in"]
    if args.deviations:
        sources.append(f"{args.deviations} ({len(extra)} rules)")
    header = {"spec": SPEC_VERSION, "suite": f"ocpmx {__version__}", "commit": suite_commit(),
              "backend": backend.name, **backend.info(), "budget": args.budget,
              "shrink": not args.no_shrink, "formats": args.formats, "ops": args.ops or list(OPS),
              "deviations": " + ".join(sources), "host": platform.node(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "command": "ocpmx conform " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["conform"] else sys.argv[1:])}
    for k, v in header.items():
        print(f"# {k}: {header_text(v)}")
    t0 = time.time()

    def progress(r):
        line = f"{r.status:>13}  {r.check}  ({r.seconds:.1f} s)"
        if r.failures:
            line += "\n               " + r.failures[0]
        print(line, flush=True)
    results = run_suite(backend, args.formats, args.budget, args.ops, progress, extra,
                        shrink=not args.no_shrink)
    header["seconds"] = round(time.time() - t0, 1)
    report = to_json(results, header)
    print("\nSummary (worst status per format and operation):\n")
    print(summary_matrix(results, args.formats))
    print()
    print(to_table(results))
    print(f"\nverdict: {report['verdict_text']} ({counts_text(report['counts'])}; "
          f"{header['seconds']} s)")
    if args.report:
        path = Path(args.report)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1))
        path.with_suffix(".md").write_text(to_markdown(results, header, backend.name))
    code = EXIT[verdict(results)]
    if args.strict and report["verdict"] == "deviation":
        code = 4
    return code

"""``ocpmx conform``: run the suite on one backend, print a table, write a JSON report.

Exit status: 0 pass (or only known deviations), 1 fail, 3 error; with --strict a verdict of
'deviation' exits 4.
"""
from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

EXIT = {"pass": 0, "deviation": 0, "fail": 1, "error": 3}
# the suite's sections (``suite.SECTIONS``), named here so that building the parser stays light
OPS = ("cast", "quantize", "dequantize", "layout", "gemm")


def add_parser(sub) -> None:
    from ..spec import FORMATS
    c = sub.add_parser("conform", help="check a backend bit for bit against the emulator")
    c.add_argument("--backend", required=True,
                   help="emulator, triton, torch, ml_dtypes, an entry point of ocpmx.backends, "
                        "or path/to/file.py:ClassName / module:ClassName")
    c.add_argument("--device", help="triton: cuda (default when present) or cpu (the interpreter)")
    c.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    c.add_argument("--ops", nargs="+", default=None, choices=OPS)
    c.add_argument("--budget", default="quick", choices=["quick", "full"])
    c.add_argument("--report", help="write the JSON report here (a .md table goes beside it)")
    c.add_argument("--strict", action="store_true", help="exit 4 when known deviations occur")
    c.set_defaults(func=cmd_conform)


def cmd_conform(args) -> int:
    if args.backend == "triton" and args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # must precede the first import of triton
    from .backends import load_backend
    from .suite import run_suite, to_json, to_table, verdict
    kwargs = {"device": args.device} if args.device and args.backend == "triton" else {}
    try:
        backend = load_backend(args.backend, **kwargs)
    except (LookupError, RuntimeError) as e:
        print(f"ocpmx conform: error: {e}", file=sys.stderr)
        return 2
    from .. import __version__
    header = {"suite": f"ocpmx {__version__}", "backend": backend.name, **backend.info(),
              "budget": args.budget, "formats": args.formats, "host": platform.node(),
              "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
              "command": "ocpmx conform " + " ".join(sys.argv[2:] if sys.argv[1:2] == ["conform"] else sys.argv[1:])}
    for k, v in header.items():
        print(f"# {k}: {v}")
    t0 = time.time()

    def progress(r):
        line = f"{r.status:>13}  {r.check}  ({r.seconds:.1f} s)"
        if r.failures:
            line += "\n               " + r.failures[0]
        print(line, flush=True)
    results = run_suite(backend, args.formats, args.budget, args.ops, progress)
    header["seconds"] = round(time.time() - t0, 1)
    report = to_json(results, header)
    print()
    print(to_table(results))
    print(f"\nverdict: {report['verdict']}  {report['counts']}  ({header['seconds']} s)")
    if args.report:
        path = Path(args.report)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1))
        head = "\n".join(f"- {k}: `{v}`" for k, v in header.items())
        path.with_suffix(".md").write_text(
            f"# Conformance: {backend.name}\n\n{head}\n\nverdict: **{report['verdict']}** "
            f"{report['counts']}\n\n{to_table(results)}\n")
    code = EXIT[verdict(results)]
    if args.strict and report["verdict"] == "deviation":
        code = 4
    return code

"""Run an audit (record the launches, compile and check each, in worker processes) and write
its JSON and Markdown reports. The verdict is the exit code: 0 pass, 1 fail (or the chip not
supported by this Triton), 2 usage error."""
from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import hashlib
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import check, record

REPO = Path(__file__).resolve().parent.parent
EXIT = {"pass": 0, "fail": 1, "not-supported": 1}


@contextlib.contextmanager
def _no_interpreter():
    """Worker processes start without TRITON_INTERPRET (they inherit the environment)."""
    saved = os.environ.pop("TRITON_INTERPRET", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved


def run_audit(arch_name: str, *, subset: bool = False, jobs: int = 1, extra=None,
              workload=None, compile_pruned: bool | None = None, progress=None) -> dict:
    """The report of one audit (a JSON-ready dict; ``report["exit_code"]`` is the verdict).

    workload: (label, call) items (default: ``record.subset_workload()`` with ``subset``, else
    ``record.full_workload()``); extra: called inside the recording after it (tests plant
    launches there); compile_pruned: also compile the autotune configs the autotuner prunes on
    this chip, to show what they would need (default: not for the subset)."""
    arch = check.ARCHS[arch_name]
    t0 = time.perf_counter()
    report = _header(arch, subset)
    if compile_pruned is None:
        compile_pruned = not subset
    if workload is None:
        workload = record.subset_workload(arch) if subset else record.full_workload(arch)
    launches, errors = record.record(arch, workload, extra)
    todo = [x for x in launches if x.reachable or compile_pruned]
    ctx = multiprocessing.get_context("spawn")
    with _no_interpreter(), concurrent.futures.ProcessPoolExecutor(
            max_workers=max(1, jobs), mp_context=ctx, initializer=check.init_worker) as pool:
        reason = pool.submit(check.probe, arch).result()
        if reason is not None:
            report.update(verdict="not-supported", exit_code=EXIT["not-supported"],
                          reason=reason, variants=[], summary={})
            return report
        futures = {pool.submit(check.audit_launch, arch, x): x for x in todo}
        results = {}
        for i, f in enumerate(concurrent.futures.as_completed(futures), 1):
            results[futures[f]] = f.result()
            if progress and (i % 50 == 0 or i == len(todo)):
                progress(f"{i}/{len(todo)} variants compiled")
    variants = [_variant(arch, i, x, results.get(x)) for i, x in enumerate(launches, 1)]
    report["workload"] = {"calls": len(workload), "errors": errors}
    report["variants"] = variants
    report["summary"] = _summary(arch, variants, errors)
    report["summary"]["wall_s"] = round(time.perf_counter() - t0, 1)
    failed = errors or any(v["status"] in ("fail", "error") for v in variants)
    report["verdict"] = "fail" if failed else "pass"
    report["exit_code"] = EXIT[report["verdict"]]
    return report


def _header(arch: check.Arch, subset: bool) -> dict:
    import torch
    import triton
    return {
        "arch": arch.name, "verdict": None, "exit_code": None,
        "command": " ".join(["ocpmx"] + sys.argv[1:]) if Path(sys.argv[0]).name in (
            "ocpmx", "cli.py", "__main__.py") else " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": _git("rev-parse", "HEAD"),
        "kernel_sources": _sources(),
        "triton": triton.__version__, "torch": torch.__version__,
        "python": platform.python_version(), "subset": subset,
        "arch_facts": {"target": str(arch.target), "lds_limit": arch.lds_limit,
                       "mx_instruction": arch.mx_instruction, "fallback": list(arch.fallback),
                       "forbidden_convert": list(arch.forbidden_convert),
                       "notes": arch.notes},
    }


def _git(*args) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _sources() -> dict:
    """SHA-256 of the compiled source files, and whether each is the committed one (other
    work may have changed the tree since the commit)."""
    out = {}
    for path in sorted((REPO / "native" / "kernels").glob("*.py")) + [REPO / "native" / "gemm.py",
                                                                     REPO / "native" / "launch.py"]:
        rel = path.relative_to(REPO).as_posix()
        text = path.read_bytes()
        committed = _git("show", f"HEAD:{rel}")
        out[rel] = {"sha256": hashlib.sha256(text).hexdigest()[:16],
                    "matches_commit": None if committed is None
                    else committed == text.decode().rstrip("\n")}
    return out


def describe(launch: record.Launch) -> str:
    """A short line of a launch's constexprs: the format by name, the rest as key=value."""
    from ..spec import Rounding, ScaleRule
    c = dict(launch.constexprs)
    if "FMT_A" in c:
        head = f"{c['FMT_A']} x {c['FMT_B']} {c['BLOCK_M']}x{c['BLOCK_N']}x{c['BLOCK_K']} " \
               f"G{c['GROUP_M']} out={'bf16' if c['OUT_BF16'] else 'fp32'}"
        return head
    fmt_keys = ("IS_INT", "BITS", "SIGN", "EBITS", "MBITS", "BIAS", "EMAX", "MAXC", "NANC",
                "INFC", "NEGMAX", "RNUM", "RSHIFT", "SUBQ", "MAXV", "ENVELOPE")
    parts = []
    if "EBITS" in c:
        parts.append("int8" if c["IS_INT"] else f"e{c['EBITS']}m{c['MBITS']}")
        if c["IS_INT"]:
            parts.append(f"NEGMAX={c['NEGMAX']}")
    for k, v in c.items():
        if k in fmt_keys:
            continue
        if k == "RULE":
            v = ScaleRule(v).label
        elif k == "ROUNDING":
            v = Rounding(v).label
        elif isinstance(v, bool):
            if v:
                parts.append(k)
            continue
        parts.append(f"{k}={v}")
    return " ".join(parts)


def _variant(arch: check.Arch, i: int, launch: record.Launch, result: dict | None) -> dict:
    out = {"id": i, "kernel": launch.name, "config": launch.config,
           "reachable": launch.reachable, "origin": launch.origin,
           "constexprs": describe(launch), "options": dict(launch.options),
           "signature": [t if a in (None, "") else f"{t}:{a}" for t, a in launch.spec]}
    if result is not None:
        out.update(result)
    if not launch.reachable:  # what a pruned config would need: information, not a check
        out["status"] = "pruned"
        out.pop("failures", None)
        if "shared_bytes" in out:
            out["pruned_note"] = ("would not fit" if out["shared_bytes"] > arch.lds_limit else
                                  "would fit: the estimate is conservative here")
    return out


def _summary(arch: check.Arch, variants: list[dict], errors: list[str]) -> dict:
    live = [v for v in variants if v["reachable"]]
    by_kernel = {}
    for v in live:
        k = by_kernel.setdefault(v["kernel"], {"variants": 0, "pass": 0, "fail": 0, "error": 0,
                                              "max_shared_bytes": 0, "instructions": []})
        k["variants"] += 1
        k[v["status"]] += 1
        k["max_shared_bytes"] = max(k["max_shared_bytes"], v.get("shared_bytes", 0))
        if "instructions" in v:
            k["instructions"].append(v["instructions"])
    for k in by_kernel.values():
        n = k.pop("instructions")
        k["instructions_min_max"] = [min(n), max(n)] if n else None
    pruned = [{"id": v["id"], "constexprs": v["constexprs"], "config": v["config"],
               "shared_bytes": v.get("shared_bytes")} for v in variants if not v["reachable"]]
    return {"variants": len(variants), "reachable": len(live),
            "pass": sum(v["status"] == "pass" for v in live),
            "fail": sum(v["status"] == "fail" for v in live),
            "error": sum(v["status"] == "error" for v in live),
            "pruned": len(pruned), "workload_errors": len(errors),
            "by_kernel": by_kernel, "pruned_configs": pruned,
            "compile_s": round(sum(v.get("compile_s", 0) for v in variants), 1)}


def _interest(v: dict) -> str:
    """The instruction of interest of a variant, for the Markdown table."""
    if "mx_instruction" in v:
        f = v.get("operand_formats") or {}
        ins = ", ".join(v["mx_instruction"] or ["none"])
        found = f.get("found")
        if "cbsz/blgp" in f.get("expected", {}):
            ins += f" ×{v.get('mx_count', 0)} cbsz/blgp {found}"
            if f.get("order", "").startswith("B,A"):
                ins += " (swapped)"
        else:
            ins += f" ×{v.get('mx_count', 0)} a/btype {found} SASS {'/'.join(v.get('sass_mma', []))}"
        return ins
    if "conversions" in v:
        return "hw conversions: " + (", ".join(v["conversions"]) or "none")
    return "–"


def markdown(report: dict) -> str:
    s = report.get("summary", {})
    lines = [f"# Compile audit: {report['arch']}", "",
             f"**Verdict: {report['verdict'].upper()}** (exit code {report['exit_code']})", ""]
    if report.get("reason"):
        lines += [f"Not supported: {report['reason']}", ""]
    lines += [f"- command: `{report['command']}`",
              f"- date: {report['date']}; git commit {report['git_commit']}",
              f"- Triton {report['triton']}, torch {report['torch']}, Python {report['python']}",
              f"- target {report['arch_facts']['target']}; shared-memory limit "
              f"{report['arch_facts']['lds_limit']:,} B; {report['arch_facts']['notes']}",
              "- compiled sources (SHA-256 prefix; as committed?): "
              + ", ".join(f"{k} {v['sha256'][:8]} {'yes' if v['matches_commit'] else 'NO'}"
                          for k, v in report["kernel_sources"].items())]
    if not s:
        return "\n".join(lines) + "\n"
    lines += [f"- workload: {report['workload']['calls']} public calls "
              f"({'CI subset' if report['subset'] else 'full'}), "
              f"{s['variants']} distinct launch variants: {s['reachable']} reachable "
              f"({s['pass']} pass, {s['fail']} fail, {s['error']} compile errors), "
              f"{s['pruned']} autotune configs pruned on this chip; compile time "
              f"{s['compile_s']} s, wall {s['wall_s']} s", ""]
    if report["workload"]["errors"]:
        lines += ["## Workload errors", ""] + [f"- {e}" for e in report["workload"]["errors"]] + [""]
    lines += ["## Per kernel", "", "| kernel | variants | pass | fail | error | max shared B | "
              "instructions (min–max) |", "|---|---|---|---|---|---|---|"]
    for name, k in s["by_kernel"].items():
        mm = k["instructions_min_max"]
        lines.append(f"| {name} | {k['variants']} | {k['pass']} | {k['fail']} | {k['error']} | "
                     f"{k['max_shared_bytes']:,} | {f'{mm[0]}–{mm[1]}' if mm else '–'} |")
    failing = [v for v in report["variants"] if v["status"] in ("fail", "error")]
    if failing:
        lines += ["", "## Failures", ""]
        lines += [f"- #{v['id']} {v['kernel']} {v['constexprs']} {v.get('config') or ''} "
                  f"{v['options']}: {'; '.join(v['failures'])} (from {v['origin']})"
                  for v in failing]
    if s["pruned_configs"]:
        lines += ["", "## Autotune configs pruned on this chip", "",
                  "| # | GEMM | config | shared B if compiled |", "|---|---|---|---|"]
        lines += [f"| {p['id']} | {p['constexprs']} | {p['config']} | "
                  f"{p['shared_bytes'] if p['shared_bytes'] is not None else 'not compiled'} |"
                  for p in s["pruned_configs"]]
    lines += ["", "## Variants", "",
              "| # | kernel | constexprs | options | status | instruction of interest | "
              "shared B | spills | instructions |", "|---|---|---|---|---|---|---|---|---|"]
    for v in report["variants"]:
        opts = " ".join(f"{k}={x}" for k, x in v["options"].items())
        lines.append(
            f"| {v['id']} | {v['kernel']} | {v['constexprs']} | {opts} | {v['status']} | "
            f"{_interest(v) if 'shared_bytes' in v else '–'} | "
            f"{v.get('shared_bytes', '–')} | {v.get('spills') or ('0' if 'spills' in v else '–')} | "
            f"{v.get('instructions', '–')} |")
    return "\n".join(lines) + "\n"


def report_paths(path: str) -> tuple[Path, Path]:
    """(JSON, Markdown) paths of ``--report PATH`` (its suffix replaced)."""
    p = Path(path)
    return p.with_suffix(".json"), p.with_suffix(".md")


def check_writable(path: str) -> str | None:
    """None if the reports can be written next to ``path``, else why not."""
    for p in report_paths(path):
        if not p.parent.is_dir():
            return f"{p.parent} is not a directory"
        try:
            with tempfile.NamedTemporaryFile(dir=p.parent, prefix=f".{p.name}."):
                pass
        except OSError as e:
            return f"cannot write in {p.parent}: {e}"
    return None


def _write_atomic(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.",
                                     delete=False) as f:
        f.write(text)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(f.name, 0o666 & ~umask)  # a temporary file is private; a report is not
    os.replace(f.name, path)


def write_reports(report: dict, path: str) -> tuple[Path, Path]:
    js, md = report_paths(path)
    _write_atomic(js, json.dumps(report, indent=1, default=str) + "\n")
    _write_atomic(md, markdown(report))
    return js, md


def main(arch: str, report: str | None, subset: bool, jobs: int) -> int:
    """``ocpmx audit``: run, print the Markdown summary, write the reports; the exit code."""
    if jobs < 1:
        print("ocpmx audit: error: --jobs must be at least 1", file=sys.stderr)
        return 2
    if report is not None and (why := check_writable(report)):
        print(f"ocpmx audit: error: --report {report}: {why}", file=sys.stderr)
        return 2
    result = run_audit(arch, subset=subset, jobs=jobs,
                       progress=lambda m: print(m, file=sys.stderr, flush=True))
    text = markdown(result)
    print(text[:text.find("\n## Variants")] if "\n## Variants" in text else text)
    if report is not None:
        for p in write_reports(result, report):
            print(f"wrote {p}")
    return result["exit_code"]

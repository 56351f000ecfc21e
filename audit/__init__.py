"""Compile audit: every kernel variant the project launches, compiled for a chip that is not
here (gfx950, sm_100a), and checked (issue 20).

  ``record``  runs a workload through the public API of ``ocpmx.native`` with ``launch.run``
              replaced by a recorder: the variants come from the real launch sites
  ``check``   per-chip facts, compiling a recorded launch, the checks
  ``report``  the audit run and its JSON / Markdown reports (``ocpmx audit``)
"""
from .check import ARCHS
from .report import run_audit

__all__ = ["ARCHS", "run_audit"]

"""Conformance suite: check any backend (new silicon, a peer library) bit for bit against the
emulator; ``ocpmx conform`` writes a report a vendor could publish."""
from .backends import BUILTIN, Backend, load_backend
from .strategies import THEMES
from .suite import STATUSES, CheckResult, probe_accumulation, run_suite, to_json, to_table, verdict

__all__ = ["BUILTIN", "Backend", "CheckResult", "STATUSES", "THEMES", "load_backend",
           "probe_accumulation", "run_suite", "to_json", "to_table", "verdict"]

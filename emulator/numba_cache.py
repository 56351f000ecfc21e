"""Keep the emulator's Numba cache in step with the sources it was compiled from.

Numba's ``cache=True`` keys each cached kernel on its own file only. A kernel that uses a
constant or calls a function from another module (``reference_kernels`` takes ``SR_BITS`` and
``stochastic_bits`` from ``philox``, which takes the definition from ``ocpmx.spec.philox``)
keeps the old machine code after that module changes: a checkout updated in place would then
round with the previous definition, silently. So the hash of every source of ``ocpmx.spec``
and ``ocpmx.emulator`` is kept beside the cache (``__pycache__/ocpmx_sources.sha256``); where it
differs, the emulator's cached kernels are deleted before any is loaded (at import: Numba
reads its cache at a kernel's first call), and Numba compiles them again.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = (HERE.parent / "spec", HERE)  # the modules the cached kernels are compiled from
MARK = "ocpmx_sources.sha256"


def sources_hash(folders=SOURCES) -> str:
    """SHA-256 over the names and bytes of the ``.py`` files of ``folders``, in order."""
    h = hashlib.sha256()
    for folder in folders:
        for path in sorted(Path(folder).glob("*.py")):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def drop_stale(cache: Path = HERE / "__pycache__", folders=SOURCES) -> bool:
    """Delete the Numba cache files (``*.nbi``, ``*.nbc``) in ``cache`` unless its mark holds
    the current ``sources_hash``, then write the mark; True where files were deleted. A cache
    that cannot be written (a read-only install: Numba then keeps its cache elsewhere, where
    this does not look) is left alone."""
    digest = sources_hash(folders)
    mark = cache / MARK
    try:
        if mark.read_text() == digest:
            return False
    except OSError:
        pass
    try:
        cache.mkdir(exist_ok=True)
        stale = [p for p in cache.iterdir() if p.suffix in (".nbi", ".nbc")]
        for p in stale:
            p.unlink(missing_ok=True)
        tmp = cache / f"{MARK}.{os.getpid()}"
        tmp.write_text(digest)
        os.replace(tmp, mark)  # (atomic: concurrent imports see the old mark or the new)
    except OSError:
        return False
    return bool(stale)

"""The emulator's Numba cache is dropped when a source it was compiled from changes
(``ocpmx.emulator.numba_cache``): Numba keys a cached kernel on its own file only."""
from ocpmx.emulator import numba_cache


def test_cache_dropped_when_a_source_changes_and_kept_otherwise(tmp_path):
    src, cache = tmp_path / "src", tmp_path / "__pycache__"
    src.mkdir()
    (src / "philox.py").write_text("SR_BITS = 16\n")
    cache.mkdir()
    for name in ("k.f-1.nbi", "k.f-1.py311.nbc", "k.cpython-311.pyc"):
        (cache / name).write_bytes(b"x")
    assert numba_cache.drop_stale(cache, (src,))  # no mark yet: whatever is cached may be stale
    assert sorted(p.name for p in cache.iterdir()) == ["k.cpython-311.pyc", numba_cache.MARK]
    (cache / "k.f-1.nbi").write_bytes(b"compiled from SR_BITS = 16")
    assert not numba_cache.drop_stale(cache, (src,))  # the same sources: kept
    assert (cache / "k.f-1.nbi").exists()
    (src / "philox.py").write_text("SR_BITS = 8\n")  # another module's constant changes
    assert numba_cache.drop_stale(cache, (src,))
    assert not (cache / "k.f-1.nbi").exists()
    assert (cache / numba_cache.MARK).read_text() == numba_cache.sources_hash((src,))
    assert not numba_cache.drop_stale(cache, (src,))


def test_the_hash_covers_names_and_bytes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "x.py").write_text("1")
    (b / "y.py").write_text("1")
    assert numba_cache.sources_hash((a,)) != numba_cache.sources_hash((b,))
    (b / "y.py").rename(b / "x.py")
    assert numba_cache.sources_hash((a,)) == numba_cache.sources_hash((b,))


def test_importing_the_emulator_marks_its_cache():
    """The import ran the check: the emulator's cache carries the hash of today's spec and
    emulator sources (a writable checkout, as in the tests)."""
    mark = numba_cache.HERE / "__pycache__" / numba_cache.MARK
    assert mark.read_text() == numba_cache.sources_hash()
    assert {p.name for p in numba_cache.SOURCES} == {"spec", "emulator"}

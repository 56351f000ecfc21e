"""Two costs of Triton's CPU interpreter that the test suite does not need, taken away.

Profiling a column-kernel test under ``TRITON_INTERPRET=1`` (Triton 3.9) put about half its
time in two places that change no result:

- ``_patch_lang``: every call of a ``@triton.jit`` helper from inside a kernel re-patches
  ``triton.language`` (``inspect.getmembers`` over the module and its tensor class, about
  1.6 ms a call), although the kernel's launch has already patched the same module and
  restores it when the grid is done. Here a helper call skips the patch when every language
  module it sees (``triton.language``, ``triton.language.core``) is already patched in the
  launch running it, by the launch or by an earlier helper call (Triton drops a helper's
  patch scope, so what it patched stays patched); the launch's own patch and restore are
  Triton's.
- The overflow sanitizer (``InterpreterOptions.sanitize_overflow``): every int32 add, sub and
  mul is redone in int64 and checked. It only asserts; the values computed are the same. (The
  compiled kernels check nothing of the kind unless built with ``debug``.) The tests compare
  the kernels' codes and scales bit for bit with the emulator, so a wrap that changes a result
  fails them anyway.

``OCPMX_INTERPRETER_AS_IS=1`` leaves the interpreter exactly as Triton ships it. Where Triton
lacks what this patches (another version), nothing is changed.
"""
import dataclasses
import os

_launches = []  # per kernel launch now running: [its language modules, its own patch done]


def _language_modules(fn, tl):
    return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)


def install():
    """Apply both changes (returns whether it did)."""
    if os.environ.get("OCPMX_INTERPRETER_AS_IS"):
        return False
    try:
        import triton.language as tl
        from triton.runtime import interpreter as it
    except ImportError:  # pragma: no cover - triton comes with the dev extra
        return False
    builder = getattr(it, "interpreter_builder", None)
    original = getattr(it, "_patch_lang", None)
    executor = getattr(it, "GridExecutor", None)
    scope_cls = getattr(it, "_LangPatchScope", None)
    if any(v is None for v in (builder, original, executor, scope_cls)):
        return False
    if getattr(original, "_ocpmx", False):
        return True
    try:
        options = dataclasses.replace(builder.options, sanitize_overflow=False)
    except TypeError:  # not the dataclass with that field this was written for
        return False
    builder.options = options
    launch = executor.__call__

    def run_grid(self, *args, **kwargs):
        _launches.append([_language_modules(self.fn, tl), False])
        try:
            return launch(self, *args, **kwargs)
        finally:
            _launches.pop()

    def patch_lang(fn):
        if not _launches:
            return original(fn)
        launch_state = _launches[-1]
        langs, own_done = launch_state
        if not own_done:  # the launch's own patch (Triton restores it when the grid is done)
            launch_state[1] = True
            return original(fn)
        seen = _language_modules(fn, tl)
        if seen <= langs:
            return scope_cls()  # a helper inside the launch: its modules are patched already
        launch_state[0] = langs | seen  # Triton keeps a helper's patch for the launch
        return original(fn)

    patch_lang._ocpmx = True
    executor.__call__ = run_grid
    it._patch_lang = patch_lang
    return True

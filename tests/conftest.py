import os

import pytest

from hypothesis import HealthCheck, settings

# Without a GPU the Triton kernels run under Triton's CPU interpreter. Triton reads the switch
# when it decorates a kernel, so it is set here, before any test module imports triton.
try:
    import torch

    HAVE_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch comes with the dev extra
    HAVE_CUDA = False
if not HAVE_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    import interpreter_speed  # two interpreter costs the tests do not need (its docstring)

    interpreter_speed.install()

# CI runs a derandomized profile: the same examples every run, failures print the minimal case.
settings.register_profile("ci", derandomize=True, max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=300, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(autouse=True)
def _fresh_plans():
    """Every test starts without per-call plans (``ocpmx.native.plans``): a plan made under
    one test's patches (tunings, ``launch.hopper``) must not serve another's calls."""
    import sys
    plans = sys.modules.get("ocpmx.native.plans")
    if plans is not None:
        plans.clear()
    yield


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """The stdlib-docstring corpus in the C4 layout with a 512-token BPE (training tests)."""
    from ocpmx.llama_train.corpus import build_corpus
    from ocpmx.llama_train.data import train_tokenizer
    d = tmp_path_factory.mktemp("c4mini")
    build_corpus(d)
    train_tokenizer(d, d / "tokenizer.json", vocab_size=512)
    return d

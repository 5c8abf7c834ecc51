"""Fixtures for the Python package's tests: the package as installed (pip
install .), else as built in build/python (cmake -DTANDEM_PYTHON=ON)."""
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STORIES = str(REPO.parent / "shared" / "models" / "gguf" / "stories260K.gguf")
CLI = os.environ.get("TANDEM_CLI") or str(REPO / "build" / "tandem")

try:
    import tandem  # noqa: F401
except ImportError:
    built = REPO / "build" / "python"
    if not (built / "tandem").is_dir():
        raise
    sys.path.insert(0, str(built))


def gemma_path():
    p = os.environ.get("TANDEM_GEMMA_MODEL") or str(Path.home() / ".cache/tandem/models/gemma-3-270m-q4_k_m.gguf")
    if not Path(p).exists():
        if os.environ.get("CI") == "true":
            pytest.fail("Gemma 3 270M is not installed (scripts/setup.sh)")
        pytest.skip("Gemma 3 270M is not installed; run scripts/setup.sh")
    return p


@pytest.fixture(scope="session")
def stories():
    from tandem import LLM

    # One compute thread: the model is tiny, so more threads only add sync.
    return LLM(model=STORIES, threads=1)


@pytest.fixture(scope="session")
def stories_f32():
    from tandem import LLM

    # K/V in f32, as llama.cpp's references were made.
    return LLM(model=STORIES, threads=1, kv_cache_dtype="f32")

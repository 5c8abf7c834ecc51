"""Session fixtures: one stories260K server for most tests, one Gemma 3 270M
server for chat (skipped when the model is not installed, failed on CI)."""
import os

import pytest

from harness import STORIES, Server, gemma_path


@pytest.fixture(scope="session")
def stories():
    # One compute thread: the model is tiny, so more threads only add sync.
    srv = Server(STORIES, threads=1)
    yield srv
    rc = srv.stop()
    assert rc == 0, f"server exited with {rc} on SIGTERM:\n{srv.log_text()}"


@pytest.fixture(scope="session")
def gemma():
    path = gemma_path()
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Gemma 3 270M is not installed (scripts/setup.sh)")
        pytest.skip("Gemma 3 270M is not installed; run scripts/setup.sh")
    srv = Server(path, "--ctx-size", "1024", "--model-alias", "gemma-test", threads=2)
    yield srv
    rc = srv.stop()
    assert rc == 0, f"server exited with {rc} on SIGTERM:\n{srv.log_text()}"

"""Session fixtures: one stories260K server for most tests, one Gemma 3 270M
server for chat (skipped when the model is not installed, failed on CI)."""

import pytest

from harness import STORIES, Server, require_gemma


@pytest.fixture(scope="session")
def stories():
    # One compute thread: the model is tiny, so more threads only add sync.
    srv = Server(STORIES, threads=1)
    yield srv
    rc = srv.stop()
    assert rc == 0, f"server exited with {rc} on SIGTERM:\n{srv.log_text()}"


@pytest.fixture(scope="session")
def gemma():
    path = require_gemma()
    srv = Server(path, "--ctx-size", "1024", "--model-alias", "gemma-test", threads=2)
    yield srv
    rc = srv.stop()
    assert rc == 0, f"server exited with {rc} on SIGTERM:\n{srv.log_text()}"

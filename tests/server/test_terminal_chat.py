"""`tandem run --chat` without a message: an interactive chat on a real
terminal (a pseudo-terminal), typed key by key. The message is prefilled during
the pauses in the typing, so the request Enter sends finds nearly all of its
prompt cached; Ctrl-D quits."""
import os
import pty
import re
import select
import time

from harness import CLI, require_gemma

MESSAGE = "Tell me three facts about the moon, one per line, and keep each fact short."


def read_until(fd, pattern, timeout, seen=b""):
    deadline = time.monotonic() + timeout
    buf = seen
    while time.monotonic() < deadline:
        if re.search(pattern, buf):
            return buf
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
    raise AssertionError(f"no {pattern!r} within {timeout} s; got {buf[-500:]!r}")


def test_gemma_terminal_chat_prefills_while_typing():
    path = require_gemma()
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(CLI, [CLI, "run", "-m", path, "--chat", "-n", "16", "--temp", "0", "-t", "2", "-c", "1024"])
    try:
        out = read_until(fd, rb"\n> ", 120)
        assert b"prefilled while you type" in out
        for i, ch in enumerate(MESSAGE):
            os.write(fd, ch.encode())
            time.sleep(0.3 if i % 25 == 24 else 0.02)  # a pause now and then, as people type
        time.sleep(1.0)
        os.write(fd, b"\r")
        out = read_until(fd, rb"\[prompt \d+ tok \(\d+ cached\)[^\]]*\]", 120, out)
        computed, cached = map(int, re.search(rb"\[prompt (\d+) tok \((\d+) cached\)", out).groups())
        assert cached > 4 * computed, out[-400:]
        # Backspace edits the line; Ctrl-D on an empty line quits.
        os.write(fd, b"abc\x7f\x7f\x7f")
        os.write(fd, b"\x04")
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        pid = 0
    finally:
        if pid:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(fd)

"""What the browser tests share: Debian's headless Chromium, a free loopback port, a server started as a
subprocess and awaited until its page answers, and the screenshots folder."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.conftest import REPO
from tests.processes import stop

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def artifacts(name: str, fresh: bool = True) -> Path:
    """``$LIFT3D_TEST_ARTIFACTS/<name>`` (default tests/artifacts/<name>/), emptied first when ``fresh``."""
    folder = Path(os.environ.get("LIFT3D_TEST_ARTIFACTS") or REPO / "tests" / "artifacts") / name
    if fresh:
        shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def serving(command: Sequence[str], url: str, log_path: Path, what: str, timeout: float, env: dict | None = None,
            stop_seconds: float = 60) -> Iterator[subprocess.Popen]:
    """Start ``command`` (output to ``log_path``), wait until ``url`` answers 200, yield the process; stopped (SIGTERM,
    then SIGKILL after ``stop_seconds``) at the end. An early exit or no answer fails with the log."""
    with open(log_path, "wb") as log:  # the child keeps its own handle
        process = subprocess.Popen(list(command), cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert process.poll() is None, f"{what} exited early:\n{log_path.read_text()}"
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"{what} did not answer at {url}:\n{log_path.read_text()}"
            time.sleep(0.3)
        yield process
    finally:
        stop(process, stop_seconds)

"""Servers that tests start as subprocesses (the app, the viewer): stopped the way a user's shell stops them."""

from __future__ import annotations

import signal
import subprocess


def stop(process: subprocess.Popen, seconds: float = 60) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``seconds`` (nothing to do when it already has)."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()

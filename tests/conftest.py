"""Shared fixtures: where the shared test data lives, and the repository root."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

def _find_data() -> Path:
    """$LIFT3D_TEST_DATA, else ``../shared/data`` beside the checkout, else the workplace's copy."""
    if "LIFT3D_TEST_DATA" in os.environ:
        return Path(os.environ["LIFT3D_TEST_DATA"])
    for candidate in (REPO.parent / "shared" / "data", Path("/work/shared/data")):
        if candidate.is_dir():
            return candidate
    return REPO.parent / "shared" / "data"


DATA = _find_data()
TEST_CONFIGS = REPO / "tests" / "configs"


def require_gpu_and_gsplat():
    """The CUDA device for a GPU test against gsplat; a RuntimeError naming what is missing (never a skip)."""
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("this test needs a CUDA device (run it on the GPU machine with -m gpu)")
    if importlib.util.find_spec("gsplat") is None:
        raise RuntimeError("this test needs gsplat: pip install 'lift3d[gpu]'")
    return torch.device("cuda")


def run_in_triton_interpreter(script: str, what: str) -> None:
    """Run ``script`` (which prints "ok" last) in a fresh Python under ``TRITON_INTERPRET=1``: a Triton kernel's CUDA
    fast path, tested on the CPU. ``what`` names the kernel for the message when triton is absent."""
    pytest.importorskip("triton", reason=f"{what} is optional (installed with the test extra on Linux)")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """``../shared/data`` (or $LIFT3D_TEST_DATA); missing data is an error, never a skip."""
    if not (DATA / "lego_tiny" / "transforms_train.json").is_file():
        raise FileNotFoundError(f"test data not found at {DATA}: set LIFT3D_TEST_DATA to the shared data folder")
    return DATA


@pytest.fixture(scope="session")
def _session_outputs(tmp_path_factory) -> Path:
    """Where runs of this session that name no absolute ``output_root`` write, instead of the checkout."""
    return tmp_path_factory.mktemp("outputs-root")


@pytest.fixture(autouse=True)
def _no_outputs_in_the_checkout(_session_outputs, monkeypatch):
    """A run with the default (relative) ``output_root`` started while the working directory is in the checkout writes
    its run_dir under a temp folder, not ``outputs/`` in the user's clone (a test that chdirs to its tmp_path first keeps
    ``tmp_path/outputs``). Every run folder comes from ``run_dirs.make_run_dir``, so that is the one place to redirect."""
    import lift3d.runs.run_dirs as run_dirs

    make_run_dir = run_dirs.make_run_dir

    def outside_the_checkout(cfg, *args, **kwargs):
        root = Path(cfg.output_root)
        if not root.is_absolute() and Path.cwd().resolve().is_relative_to(REPO):
            cfg = dataclasses.replace(cfg, output_root=str(_session_outputs / root))
        return make_run_dir(cfg, *args, **kwargs)

    monkeypatch.setattr(run_dirs, "make_run_dir", outside_the_checkout)


@pytest.fixture(autouse=True)
def _videos_without_ffmpeg_on_gpu_machines(request, monkeypatch):
    """The GPU machines here lack imageio-ffmpeg (its wheel is more than what may travel to them): in ``gpu`` tests
    an .mp4's frames are then written as a GIF under the .mp4's name. CPU runs (CI) always encode real .mp4s."""
    import importlib.util

    if request.node.get_closest_marker("gpu") is None or importlib.util.find_spec("imageio_ffmpeg") is not None:
        return
    import imageio.v3 as iio
    import numpy as np

    def as_gif(path, frames, fps):
        iio.imwrite(path, np.stack(frames), extension=".gif", duration=1000 / fps, loop=0)

    monkeypatch.setattr("lift3d.saving._write_mp4", as_gif)


@pytest.fixture(autouse=True)
def _no_vggt_weights_of_this_machine(monkeypatch):
    """`lift3d poses` and `reconstruct` pick VGGT where its weights are on the machine (the Hugging Face cache, say):
    tests see none unless they name some, so a test of structure from motion stays one on every machine."""
    monkeypatch.setenv("LIFT3D_VGGT_WEIGHTS", "off")


@pytest.fixture(autouse=True)
def _restore_matmul_precision():
    """Runs set torch's global float32 matmul precision (TF32 on CUDA); later tests must not inherit it."""
    import torch

    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


@pytest.fixture(autouse=True)
def _restore_lift3d_logger():
    """The CLI makes the ``lift3d`` logger stop propagating (its own stderr handler); a later test's caplog, which
    listens on the root logger in older pytest, must still hear it (the CLI's handler stays: no doubled lines, as
    the root has none outside pytest)."""
    import logging

    logger = logging.getLogger("lift3d")
    logger.propagate = True  # also after a session fixture ran the CLI before this test began
    level = logger.level
    yield
    logger.propagate = True
    logger.setLevel(level)


@pytest.fixture
def chromium(tmp_path):
    """Debian's headless Chromium through Playwright: ``chromium(**context_options)`` opens a browser context with a
    profile of its own under ``tmp_path`` (e.g. ``viewport=``, ``accept_downloads=``); all closed after the test."""
    from playwright.sync_api import sync_playwright

    from tests.browser import CHROMIUM, CHROMIUM_ARGS

    assert CHROMIUM.is_file(), "Debian's chromium is needed at /usr/bin/chromium: apt-get install -y chromium"
    with sync_playwright() as playwright:
        opened = []

        def open_context(**options):
            context = playwright.chromium.launch_persistent_context(
                str(tmp_path / f"profile-{len(opened)}"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
                **options)
            opened.append(context)
            return context

        try:
            yield open_context
        finally:
            for context in opened:
                context.close()

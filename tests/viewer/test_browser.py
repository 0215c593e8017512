"""``lift3d view`` in a real headless Chromium (Debian's /usr/bin/chromium through Playwright, as tests/app/test_browser.py):
the page's canvas shows the Gaussians lift3d renders server-side, the render-mode dropdown switches it to depth,
and a two-keyframe camera path recorded with the page's buttons renders to an mp4 with the right frame count.
Screenshots go to $LIFT3D_TEST_ARTIFACTS/viewer (default tests/artifacts/viewer/). A missing viser, Playwright or
chromium fails the test with the install command; it never skips."""

import importlib.util
import io
import os
import sys
import time
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest

from tests.browser import artifacts, free_port, serving
from tests.viewer_scene import write_gaussian_ply

pytestmark = pytest.mark.slow


@pytest.fixture
def viewer(tmp_path):
    """``lift3d view`` of a few hundred Gaussians on a free loopback port; stopped (SIGTERM) at the end."""
    assert importlib.util.find_spec("viser") is not None, "viser is missing: pip install -e '.[test]' (or '.[viewer]')"
    ply = write_gaussian_ply(tmp_path / "gaussians.ply")
    port = free_port()
    command = [sys.executable, "-m", "lift3d", "view", str(ply), "--port", str(port), "--device", "cpu"]
    url = f"http://127.0.0.1:{port}/"
    with serving(command, url, tmp_path / "viewer.log", "lift3d view", timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
                 stop_seconds=30):
        yield url, ply, tmp_path


def _canvas(page) -> np.ndarray:
    """The 3D canvas as RGB, cropped to its left half's middle (the GUI panel floats over the right side)."""
    from PIL import Image

    shot = np.asarray(Image.open(io.BytesIO(page.locator("canvas[data-engine]").screenshot())).convert("RGB"), dtype=np.int16)
    h, w = shot.shape[:2]
    return shot[h // 4 : 3 * h // 4, w // 4 : 5 * w // 8]


def _object_fraction(pixels: np.ndarray) -> float:
    """Share of pixels unlike the background (the most common color of the frame's border)."""
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    colors, counts = np.unique(border, axis=0, return_counts=True)
    background = colors[counts.argmax()]
    return float((np.abs(pixels - background).max(axis=-1) > 40).mean())


def _wait_for(page, predicate, what: str, shots: Path, timeout: float = 90.0) -> np.ndarray:
    deadline = time.monotonic() + timeout
    while True:
        pixels = _canvas(page)
        if predicate(pixels):
            return pixels
        if time.monotonic() > deadline:
            page.screenshot(path=shots / "timeout.png")
            raise AssertionError(f"timed out waiting for {what} (see {shots / 'timeout.png'})")
        time.sleep(0.5)


def test_view_shows_the_gaussians_and_switches_to_depth(viewer, chromium):
    from lift3d.commands.render import render_camera_path
    from lift3d.viewer.path import load_camera_path

    url, ply, tmp_path = viewer
    shots = artifacts("viewer")
    page = chromium(viewport={"width": 1000, "height": 700}).new_page()
    page.goto(url)
    page.wait_for_selector("canvas[data-engine]", timeout=60_000)
    rgb = _wait_for(page, lambda p: _object_fraction(p) > 0.05, "the rendered Gaussians on the canvas", shots)
    time.sleep(1.0)  # the full-size render follows the preview
    rgb = _canvas(page)
    page.screenshot(path=shots / "1-rgb.png")
    assert 0.05 < _object_fraction(rgb) < 0.9, f"object covers {_object_fraction(rgb):.1%} of the view"

    page.get_by_label("Render mode").click()
    page.get_by_role("option", name="depth").click()
    depth = _wait_for(page, lambda p: np.abs(p - rgb).mean() > 5, "the depth picture", shots)
    time.sleep(1.0)
    depth = _canvas(page)
    page.screenshot(path=shots / "2-depth.png")
    assert np.abs(depth - rgb).mean() > 5 and _object_fraction(depth) > 0.05

    # a two-keyframe camera path recorded on the page: add, orbit the camera by dragging, add, save
    page.get_by_label("FPS").fill("6")
    page.get_by_label("Seconds").fill("1.5")
    page.get_by_role("button", name="Add keyframe").click()
    page.wait_for_selector("text=1 keyframe(s)", timeout=30_000)
    page.mouse.move(300, 350)
    page.mouse.down()
    page.mouse.move(150, 330, steps=10)
    page.mouse.up()
    time.sleep(1.0)
    page.get_by_role("button", name="Add keyframe").click()
    page.wait_for_selector("text=2 keyframe(s)", timeout=30_000)
    page.get_by_role("button", name="Save path.json").click()
    page.wait_for_selector("text=saved to", timeout=30_000)
    page.screenshot(path=shots / "3-path.png")
    path_json = tmp_path / "path.json"  # the page's default: beside the viewed file
    recorded = load_camera_path(path_json)
    assert len(recorded.keyframes) == 2 and recorded.frame_count() == 9
    first, second = (np.array(k.c2w) for k in recorded.keyframes)
    assert np.abs(first - second).max() > 0.05, "dragging should have moved the camera between the keyframes"
    video, frames = render_camera_path(ply, path_json, shots / "path.mp4", width=64, height=48, device="cpu")
    assert frames == 9 and len(list(iio.imiter(video))) == 9


def _step(page) -> int | None:
    import re

    match = re.search(r"step (\d+) / \d+", page.inner_text("body"))
    return int(match.group(1)) if match else None


def test_pause_button_holds_a_cpu_training_run(tmp_path, chromium):
    """``lift3d reconstruct --viewer`` of the sample scene on the CPU: the page shows the step counter and the
    training cameras; Pause holds the counter, Resume lets it run on."""
    assert importlib.util.find_spec("viser") is not None, "viser is missing: pip install -e '.[test]' (or '.[viewer]')"
    port = free_port()
    command = [sys.executable, "-m", "lift3d", "reconstruct", "--viewer", "--viewer-port", str(port), f"output_root={tmp_path}",
               "trainer.max_steps=5000", "trainer.val_check_interval=0", "trainer.run_test_after_fit=false",
               "trainer.enable_progress_bar=false", "checkpoint.every_n_train_steps=0", "system.gaussians.init_points=500",
               "system.export.formats=[]", "viewer.max_side=128", "viewer.preview_max_side=64"]
    shots = artifacts("viewer", fresh=False)
    url = f"http://127.0.0.1:{port}/"
    with serving(command, url, tmp_path / "train.log", "lift3d reconstruct --viewer", timeout=180,
                 env={**os.environ, "OMP_NUM_THREADS": "1"}, stop_seconds=30) as process:
        page = chromium(viewport={"width": 1000, "height": 700}).new_page()
        page.goto(url)
        page.wait_for_selector("text=Pause training", timeout=60_000)
        deadline = time.monotonic() + 60
        while (_step(page) or 0) < 5:
            assert time.monotonic() < deadline, f"no training steps on the page:\n{page.inner_text('body')}"
            time.sleep(0.3)
        assert "loss" in page.inner_text("body") and "Gaussians" in page.inner_text("body")
        page.get_by_role("button", name="Pause training").click()
        page.wait_for_selector("text=Resume training", timeout=30_000)
        page.wait_for_selector("text=paused", timeout=30_000)
        held = _step(page)
        time.sleep(2.5)
        page.screenshot(path=shots / "4-training-paused.png")
        assert _step(page) == held, "the step counter moved while paused"
        page.get_by_role("button", name="Resume training").click()
        deadline = time.monotonic() + 60
        while (_step(page) or 0) <= held:
            assert time.monotonic() < deadline, "training did not resume"
            time.sleep(0.3)
        assert process.poll() is None

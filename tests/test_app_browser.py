"""The web app in a real headless Chromium: bad input, a short run with live progress, reload, 3D viewer, download.

Screenshots before, during and after the run go to $LIFT3D_TEST_ARTIFACTS (default tests/artifacts/app/).
The recipe is the test-only coloured sphere; to drive a real short recipe instead, change APP_RECIPE.
"""

import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, TEST_CONFIGS

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# the recipe the page runs (a YAML entry of an app recipes file; see lift3d/app/recipes.py)
APP_RECIPE = f"""
- label: "Test: coloured sphere"
  config: {TEST_CONFIGS / 'app-mesh.yaml'}
  input_keys: [system.prompt]
  options: {{steps: trainer.max_steps, seed: seed, resolution: system.resolution}}
  export_formats: [glb]
  description: "A test-only recipe: fits an image and wraps it around a sphere."
"""
RECIPE_LABEL = "Test: coloured sphere"
STEPS = 40


def _artifacts() -> Path:
    folder = Path(os.environ.get("LIFT3D_TEST_ARTIFACTS") or REPO / "tests" / "artifacts") / "app"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def server(tmp_path):
    """``lift3d app`` on a free loopback port, with the test recipe; stopped (SIGTERM) at the end."""
    port = _free_port()
    (tmp_path / "recipes.yaml").write_text(APP_RECIPE)
    env = {**os.environ, "LIFT3D_APP_RECIPES": str(tmp_path / "recipes.yaml"), "GRADIO_ANALYTICS_ENABLED": "False",
           "GRADIO_TEMP_DIR": str(tmp_path / "gradio")}
    with open(tmp_path / "server.log", "wb") as log:  # the child keeps its own handle
        process = subprocess.Popen([sys.executable, "-m", "lift3d", "app", "--port", str(port), "--output-root", str(tmp_path / "outputs")],
                                   cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 240
    while True:
        assert process.poll() is None, f"the app exited early:\n{(tmp_path / 'server.log').read_text()}"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, f"the app did not answer at {url}:\n{(tmp_path / 'server.log').read_text()}"
        time.sleep(0.5)
    try:
        yield url, process, tmp_path
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _status(page) -> dict:
    element = page.locator("#lift3d-status")
    return {key: element.get_attribute(f"data-{key}") for key in ("job", "state", "step")}


def _wait(page, predicate, timeout: float, what: str) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status = _status(page)
        if predicate(status):
            return status
        assert time.monotonic() < deadline, f"timed out waiting for {what}; last status {status}: {page.inner_text('#job-status')}"
        time.sleep(0.25)


def _canvas_has_a_picture(page) -> bool:
    from PIL import Image

    canvas = page.locator("#result-model canvas")
    if canvas.count() == 0 or not canvas.first.is_visible():
        return False
    pixels = np.asarray(Image.open(io.BytesIO(canvas.first.screenshot())).convert("RGB"), dtype=np.float32)
    return float(pixels.std(axis=(0, 1)).max()) > 20.0  # a coloured sphere, not an empty canvas


def test_app_runs_a_job_in_a_real_browser(server):
    from playwright.sync_api import sync_playwright

    url, process, tmp_path = server
    assert CHROMIUM.is_file(), "Debian's chromium is needed at /usr/bin/chromium: apt-get install -y chromium"
    shots = _artifacts()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 1000}, accept_downloads=True)
        try:
            page = browser.new_page()
            page.goto(url)
            page.wait_for_selector("#lift3d-status[data-state=idle]", timeout=60_000)
            if page.locator("#recipe input").input_value() != RECIPE_LABEL:  # the built-in recipes come first
                page.click("#recipe input")
                page.get_by_role("option", name=RECIPE_LABEL).click()
            page.wait_for_selector("#prompt textarea", timeout=30_000)
            assert page.locator("#recipe input").input_value() == RECIPE_LABEL
            page.screenshot(path=shots / "1-before.png", full_page=True)

            # bad input: a clear message on the page, and the server keeps running
            page.click("#start")
            page.wait_for_selector("#lift3d-message[data-kind=error]", timeout=30_000)
            assert "type a prompt" in page.inner_text("#lift3d-message")
            page.fill("#prompt textarea", "a glazed ceramic apple")
            page.fill("#opt-steps :is(input, textarea)", "many")
            page.click("#start")
            page.wait_for_selector("#lift3d-message:has-text('steps must be a number')", timeout=30_000)
            page.screenshot(path=shots / "2-bad-input.png", full_page=True)
            assert process.poll() is None

            # a short run: progress advances step by step
            page.fill("#opt-steps :is(input, textarea)", str(STEPS))
            page.click("#start")
            page.wait_for_selector("#lift3d-message[data-kind=info]:has-text('starting')", timeout=30_000)
            first = _wait(page, lambda s: s["state"] == "running" and int(s["step"]) > 0, 240, "the first steps")
            job = first["job"]
            _wait(page, lambda s: s["state"] != "running" or int(s["step"]) > int(first["step"]), 120, "more steps")
            page.screenshot(path=shots / "3-during.png", full_page=True)
            assert "loss" in page.inner_text("#job-status")

            # a reload finds the same job on the server again
            page.reload()
            page.wait_for_selector(f"#lift3d-status[data-job='{job}']", timeout=60_000)
            done = _wait(page, lambda s: s["state"] in ("finished", "failed", "cancelled"), 300, "the run to end")
            assert done["state"] == "finished", page.inner_text("#job-status")
            assert int(done["step"]) == STEPS

            # the result: the 3D viewer draws the model, the orbit video and the downloads are there
            deadline = time.monotonic() + 60
            while not _canvas_has_a_picture(page):
                assert time.monotonic() < deadline, "the 3D viewer never drew the model"
                time.sleep(0.5)
            page.wait_for_selector("#result-video video", timeout=30_000)
            page.wait_for_selector("#latest-image img", timeout=30_000)  # the last validation grid
            page.screenshot(path=shots / "4-after.png", full_page=True)
            with page.expect_download(timeout=30_000) as download_info:
                page.click("#result-files a[download$='.glb']")
            glb = shots / "sphere.glb"
            download_info.value.save_as(glb)
        finally:
            browser.close()
    import trimesh

    mesh = trimesh.load(glb, force="mesh")
    assert len(mesh.vertices) == 642
    assert np.asarray(mesh.visual.vertex_colors)[:, :3].std(axis=0).min() > 5  # coloured by the fitted image
    assert process.poll() is None  # still serving after everything

"""The web app in a real headless Chromium: bad input, a short run with live progress, reload, 3D viewer, download.

The page runs the built-in "Text to 3D: Gaussian SDS (fast)" recipe (lift3d/configs/gaussian-sds.yaml, the
gaussian-sds system and the Stable Diffusion SDS guidance) against the tiny random-weight pipeline of
tests/tiny_diffusion.py, typed into the page's Model option. A recipes file re-declares that table entry with
the same label, configs and options plus fixed overrides that shrink it to a CPU-sized run (small renders and
grids, few Gaussians and test views, a prompt cache in tmp); nothing else about the recipe changes.
Screenshots before, during and after the run go to $LIFT3D_TEST_ARTIFACTS (default tests/artifacts/app/).
"""

import dataclasses
import io
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lift3d.app.recipes import default_recipes
from tests.browser import artifacts, free_port, serving
from tests.tiny_diffusion import tiny_sd_path
from tests.validators import gltf_problems, validate_gltf

RECIPE_LABEL = "Text to 3D: Gaussian SDS (fast)"  # a built-in entry of lift3d/app/recipes.py
PROMPT = "a glazed ceramic apple"
STEPS = 100  # 15-25 steps/s on one CPU thread: several progress updates (one a second) during the run
RESOLUTION = 32  # the page's Resolution option: training renders of 32x32 (upsampled to the guidance's 64)
# fixed overrides that make the real recipe a CPU-sized run (the page sets steps, resolution and model)
TINY_OVERRIDES = [
    "data.batch_size=1", "data.eval_height=64", "data.eval_width=64", "data.n_val_views=1", "data.n_test_views=8",
    "system.guidance.resolution=64", "system.gaussians.init_points=500", "system.renderer.tile_size=8",
    "system.export.resolution=32", "system.export.texture_size=64",
    "trainer.val_check_interval=50", "checkpoint.every_n_train_steps=50",
]


def _recipes_file(tmp_path: Path) -> Path:
    """An app recipes file that re-declares the built-in entry (same label, configs, options) with tiny overrides, as an
    operator's entry (no method-table method: the page offers it on a CPU)."""
    builtin = next(r for r in default_recipes() if r.label == RECIPE_LABEL)
    entry = {field.name: getattr(builtin, field.name) for field in dataclasses.fields(builtin)}
    entry["options"] = {option: list(keys) for option, keys in builtin.options.items()}
    entry["method"] = None  # an operator's entry: it trains its configs as given (the tiny overrides run on a CPU)
    entry["overrides"] = [*builtin.overrides, *TINY_OVERRIDES, f"system.guidance.prompt_cache_dir={tmp_path / 'prompt-cache'}"]
    path = tmp_path / "recipes.yaml"
    path.write_text(json.dumps([entry], default=list, indent=1))  # JSON is YAML
    return path


@pytest.fixture
def server(tmp_path):
    """``lift3d app`` on a free loopback port, with the tiny recipe entry; stopped (SIGTERM) at the end."""
    port = free_port()
    env = {**os.environ, "LIFT3D_APP_RECIPES": str(_recipes_file(tmp_path)), "GRADIO_ANALYTICS_ENABLED": "False",
           "GRADIO_TEMP_DIR": str(tmp_path / "gradio"), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}  # tiny models are all overhead: one thread is fastest on a shared CPU
    command = [sys.executable, "-m", "lift3d", "app", "--port", str(port), "--output-root", str(tmp_path / "outputs")]
    url = f"http://127.0.0.1:{port}/"
    with serving(command, url, tmp_path / "server.log", "the app", timeout=240, env=env) as process:
        yield url, process, tmp_path


def _status(page) -> dict:
    element = page.locator("#lift3d-status")
    return {key: element.get_attribute(f"data-{key}") for key in ("job", "state", "step")}


def _wait(page, predicate, timeout: float, what: str) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status = _status(page)
        if predicate(status):
            return status
        last = page.inner_text("#job-status")
        assert time.monotonic() < deadline, f"timed out waiting for {what}; last status {status}: {last}"
        time.sleep(0.25)


def _canvas_has_a_picture(page) -> bool:
    from PIL import Image

    canvas = page.locator("#result-model canvas")
    if canvas.count() == 0 or not canvas.first.is_visible():
        return False
    pixels = np.asarray(Image.open(io.BytesIO(canvas.first.screenshot())).convert("RGB"), dtype=np.float32)
    return float(pixels.std(axis=(0, 1)).max()) > 20.0  # a shaded model, not an empty canvas


@pytest.mark.slow
def test_app_runs_a_job_in_a_real_browser(server, chromium):
    url, process, tmp_path = server
    shots = artifacts("app")
    browser = chromium(viewport={"width": 1280, "height": 1000}, accept_downloads=True)
    page = browser.new_page()
    console: list[str] = []  # the page's own errors, saved when the viewer stays empty
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
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
    page.fill("#prompt textarea", PROMPT)
    page.fill("#opt-steps :is(input, textarea)", "many")
    page.click("#start")
    page.wait_for_selector("#lift3d-message:has-text('steps must be a number')", timeout=30_000)
    page.screenshot(path=shots / "2-bad-input.png", full_page=True)
    assert process.poll() is None

    # a short run of the real recipe on the tiny pipeline: progress advances step by step
    page.fill("#opt-steps :is(input, textarea)", str(STEPS))
    page.fill("#opt-resolution :is(input, textarea)", str(RESOLUTION))
    page.fill("#opt-model_path :is(input, textarea)", str(tiny_sd_path()))
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
    done = _wait(page, lambda s: s["state"] in ("finished", "failed", "canceled"), 300, "the run to end")
    assert done["state"] == "finished", page.inner_text("#job-status")
    assert int(done["step"]) == STEPS

    # the result: the 3D viewer draws the model, the orbit video and the downloads are there
    deadline = time.monotonic() + 60
    while not _canvas_has_a_picture(page):
        if time.monotonic() > deadline:
            page.screenshot(path=shots / "no-model.png", full_page=True)
            (shots / "console.txt").write_text("\n".join(console))
            raise AssertionError("the 3D viewer never drew the model (see no-model.png)")
        time.sleep(0.5)
    page.wait_for_selector("#result-video video", timeout=30_000)
    page.wait_for_selector("#latest-image img", timeout=30_000)  # the last validation grid
    page.screenshot(path=shots / "4-after.png", full_page=True)
    with page.expect_download(timeout=30_000) as download_info:
        page.click("#result-files a[download$='.glb']")
    glb = shots / "result.glb"
    download_info.value.save_as(glb)
    import trimesh
    from omegaconf import OmegaConf

    run_dir = next((tmp_path / "outputs" / "gaussian-sds").glob("*/configs")).parent  # named by the real recipe
    parsed = OmegaConf.load(run_dir / "configs" / "parsed.yaml")
    assert (parsed.system_type, parsed.system.guidance_type) == ("gaussian-sds", "stable-diffusion")
    assert parsed.system.guidance.pretrained_model_name_or_path == str(tiny_sd_path())  # the page's Model option
    assert (parsed.trainer.max_steps, parsed.data.height, parsed.system.guidance.prompt) == (STEPS, RESOLUTION, PROMPT)
    assert glb.read_bytes() == (run_dir / "save" / f"it{STEPS}.glb").read_bytes()  # the download is the run's own export
    mesh = trimesh.load(glb, force="mesh")
    assert len(mesh.faces) > 0 and len(mesh.vertices) > 0
    report = validate_gltf(glb)[0]  # the Khronos glTF validator
    assert report["issues"]["numErrors"] == 0 and report["issues"]["numWarnings"] == 0, gltf_problems(report)
    assert process.poll() is None  # still serving after everything

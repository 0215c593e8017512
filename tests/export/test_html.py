"""``lift3d export FILE --format html``: one self-contained page that shows the Gaussians in Chromium opened from a
file:// URL (no server, no network): the object is in the middle of the canvas, and dragging turns it. Screenshots go
to $LIFT3D_TEST_ARTIFACTS/html (default tests/artifacts/html/). A missing Playwright or chromium fails the test."""

import io
import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from lift3d.cli import main
from lift3d.gaussians.formats.ply import save_ply
from lift3d.sh import rgb_to_sh
from tests.browser import CHROMIUM, CHROMIUM_ARGS
from tests.conftest import REPO


def _two_tone_object(path: Path, n: int = 3000) -> Path:
    """A 0.4 x 0.2 x 0.2 box of opaque Gaussians away from the origin: its +x half red, its -x half blue (so turning it
    changes the picture)."""
    g = torch.Generator().manual_seed(0)
    local = (torch.rand(n, 3, generator=g) - 0.5) * torch.tensor([0.4, 0.2, 0.2])
    colors = torch.where(local[:, :1] > 0, torch.tensor([[0.9, 0.1, 0.1]]), torch.tensor([[0.1, 0.2, 0.9]]))
    save_ply(path, {"means": local + torch.tensor([0.5, -1.0, 0.3]), "log_scales": torch.full((n, 3), math.log(0.012)),
                    "quats": torch.tensor([[1.0, 0, 0, 0]]).repeat(n, 1), "opacity_logits": torch.full((n,), 4.0),
                    "sh0": rgb_to_sh(colors)[:, None], "shN": torch.zeros(n, 0, 3)})
    return path


def test_the_page_is_one_file_with_the_gaussians_inside(tmp_path):
    path = _two_tone_object(tmp_path / "box.ply", n=500)
    assert main(["export", str(path), "--format", "html"]) == 0
    page = (tmp_path / "box-ply.html").read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)  # nothing fetched
    assert "<script src" not in page and "import(" not in page
    splats = re.search(r'<script id="splats" type="application/octet-stream">([^<]*)</script>', page).group(1)
    assert len(splats) == math.ceil(500 * 32 / 3) * 4  # base64 of the 32-byte .splat records


def _canvas(page) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(page.locator("canvas").screenshot())).convert("RGB")).astype(float)


@pytest.mark.slow
def test_the_page_opens_from_disk_in_chromium_and_orbits(tmp_path):
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.is_file(), "Debian's chromium is needed at /usr/bin/chromium: apt-get install -y chromium"
    path = _two_tone_object(tmp_path / "box.ply")
    assert main(["export", str(path), "--format", "html"]) == 0
    shots = Path(os.environ.get("LIFT3D_TEST_ARTIFACTS") or REPO / "tests" / "artifacts") / "html"
    shutil.rmtree(shots, ignore_errors=True)
    shots.mkdir(parents=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                             args=[*CHROMIUM_ARGS, "--allow-file-access-from-files"])
        try:
            page = browser.new_page(viewport={"width": 480, "height": 360})
            requests: list[str] = []
            page.on("request", lambda request: requests.append(request.url))
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto((tmp_path / "box-ply.html").as_uri())
            page.wait_for_function("window.lift3dFrames >= 1", timeout=60_000)
            before = _canvas(page)
            page.screenshot(path=shots / "1-opened.png")
            h, w = before.shape[:2]
            center = before[h // 4 : 3 * h // 4, w // 4 : 3 * w // 4]
            covered = (np.abs(center - 255.0).max(axis=-1) > 40).mean()  # the page's background is white
            assert covered > 0.2, f"the object covers {covered:.0%} of the canvas's center"
            assert (np.abs(before[:8, :8] - 255.0).max() < 5)  # with a margin of background around it

            page.mouse.move(w / 2, h / 2)
            page.mouse.down()
            page.mouse.move(w / 2 + 120, h / 2 + 20, steps=6)
            page.mouse.up()
            page.wait_for_function("window.lift3dFrames >= 2", timeout=30_000)
            after = _canvas(page)
            page.screenshot(path=shots / "2-dragged.png")
            assert np.abs(after - before).mean() > 3, "dragging did not change the picture"
            assert not errors, errors
            assert all(url.startswith(("file:", "data:", "blob:")) for url in requests), requests
        finally:
            browser.close()

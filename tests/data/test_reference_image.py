"""Reference photos for image-to-3D: cut out (alpha, rembg, plain background), centered and scaled."""

import logging
import sys

import numpy as np
import pytest
from PIL import Image

from lift3d.cli import main
from lift3d.data.reference_image import SegmentationMissingError, cut_out, plain_background_alpha, recenter


def studio_photo() -> tuple[np.ndarray, np.ndarray]:
    """A textured object on a gray, slightly noisy backdrop (RGBA with opaque alpha) and its true mask."""
    rng = np.random.default_rng(0)
    rgb = np.clip(rng.normal(200, 2, (80, 100, 3)), 0, 255).astype(np.uint8)
    yy, xx = np.mgrid[0:80, 0:100]
    mask = ((xx - 60) ** 2 / 20**2 + (yy - 30) ** 2 / 15**2) < 1
    rgb[mask] = np.stack([(xx[mask] * 7) % 255, np.full(mask.sum(), 40), (yy[mask] * 5) % 255], -1)
    return np.concatenate([rgb, np.full((80, 100, 1), 255, np.uint8)], -1), mask


def test_plain_background_cut_finds_the_object():
    rgba, mask = studio_photo()
    found = plain_background_alpha(rgba[..., :3]) > 127
    iou = (found & mask).sum() / (found | mask).sum()
    assert iou > 0.9, iou


def test_recenter_centers_and_scales_the_object():
    rgba, mask = studio_photo()
    rgba[..., 3] = mask * 255
    out = recenter(rgba, 64, 0.8)
    ys, xs = np.nonzero(out[..., 3] > 127)
    assert out.shape == (64, 64, 4)
    assert abs((xs.min() + xs.max()) / 2 - 31.5) <= 1.5 and abs((ys.min() + ys.max()) / 2 - 31.5) <= 1.5
    assert abs(max(xs.max() - xs.min(), ys.max() - ys.min()) + 1 - 0.8 * 64) <= 2
    assert recenter(rgba, 32, 0.0).shape == (32, 32, 4)


def test_missing_rembg_says_how_to_install_it(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "rembg", None)  # import rembg raises ImportError, installed or not
    rgba, mask = studio_photo()
    with pytest.raises(SegmentationMissingError, match=r"pip install 'lift3d\[segment\]'"):
        cut_out(rgba, "rembg")
    with caplog.at_level(logging.INFO, logger="lift3d.data"):
        auto = cut_out(rgba, "auto")  # falls back to the plain-background cut, and says so
    assert "rembg is not installed" in caplog.text and ((auto[..., 3] > 127) == mask).mean() > 0.95
    kept = rgba.copy()
    kept[..., 3] = mask * 255
    assert (cut_out(kept, "auto") == kept).all()  # a real alpha channel is kept as it is


def test_generate_reports_a_missing_segmenter_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rembg", None)
    rgba, _ = studio_photo()
    Image.fromarray(np.ascontiguousarray(rgba[..., :3])).save(tmp_path / "photo.jpg")
    code = main(["generate", "--image", str(tmp_path / "photo.jpg"), "data.background_removal=rembg", f"output_root={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2 and "lift3d[segment]" in err and "Traceback" not in err

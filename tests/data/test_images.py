"""Photos as cameras and tools write them: EXIF orientation, grayscale, 16-bit, palette and RGBA."""

import cv2
import numpy as np
import pytest
from PIL import Image

from lift3d.data.capture import SceneFormatError
from lift3d.data.images import load_rgba
from lift3d.data.transforms_json import image_size


def test_exif_orientation_is_applied(tmp_path):
    upright = np.zeros((12, 8, 3), np.uint8)
    upright[:4, :4] = [255, 0, 0]  # top-left marker of the upright picture
    stored = np.rot90(upright, k=1)  # what a phone held upright stores with orientation 6 (rotate 90 CW to view)
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(np.ascontiguousarray(stored)).save(tmp_path / "phone.jpg", exif=exif, quality=100, subsampling=0)
    rgba = load_rgba(tmp_path / "phone.jpg")
    assert rgba.shape == (12, 8, 4) and image_size(tmp_path / "phone.jpg") == (8, 12)
    assert rgba[1, 1, 0] > 200 and rgba[1, 1, 1] < 60 and rgba[-2, -2, 0] < 60


def test_grayscale_16bit_palette_and_rgba(tmp_path):
    ramp16 = (np.linspace(0, 65535, 12).reshape(3, 4)).astype(np.uint16)
    Image.fromarray(ramp16).save(tmp_path / "gray16.png")
    gray16 = load_rgba(tmp_path / "gray16.png")
    assert gray16.shape == (3, 4, 4) and gray16[0, 0, 0] == 0 and gray16[-1, -1, 0] == 255 and (gray16[..., 3] == 255).all()
    assert np.allclose(gray16[..., 0].astype(float), ramp16 / 65535 * 255, atol=1)

    color16 = np.zeros((2, 3, 3), np.uint16)
    color16[..., 2] = 65535  # OpenCV writes BGR: blue channel full
    color16[0, 0, 1] = 32768
    cv2.imwrite(str(tmp_path / "color16.png"), color16)
    rgb = load_rgba(tmp_path / "color16.png")
    assert tuple(rgb[1, 1, :3]) == (255, 0, 0) and rgb[0, 0, 1] == 128

    Image.fromarray(np.full((2, 2), 77, np.uint8), "L").save(tmp_path / "gray.png")
    assert (load_rgba(tmp_path / "gray.png")[..., :3] == 77).all()

    rgba = np.zeros((2, 2, 4), np.uint8)
    rgba[..., 3] = [[0, 255], [128, 255]]
    Image.fromarray(rgba, "RGBA").save(tmp_path / "cutout.png")
    assert (load_rgba(tmp_path / "cutout.png")[..., 3] == rgba[..., 3]).all()

    Image.fromarray(np.full((4, 4, 3), 200, np.uint8)).convert("P", palette=Image.Palette.ADAPTIVE).save(tmp_path / "pal.png")
    assert abs(int(load_rgba(tmp_path / "pal.png")[0, 0, 0]) - 200) <= 2


def test_downscale_and_bad_files(tmp_path):
    Image.fromarray(np.full((8, 6, 3), 10, np.uint8)).save(tmp_path / "a.png")
    assert load_rgba(tmp_path / "a.png", downscale=2).shape == (4, 3, 4)
    (tmp_path / "broken.jpg").write_bytes(b"not an image")
    with pytest.raises(SceneFormatError, match="cannot read the image .*broken.jpg"):
        load_rgba(tmp_path / "broken.jpg")

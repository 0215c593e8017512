"""Reading photos as they come from cameras and tools: EXIF orientation, grayscale, 16-bit, palette, RGBA.

Every image becomes ``[H, W, 4] uint8`` RGBA (alpha 255 where the file has none), optionally reduced by
an integer factor with a box filter.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from lift3d.data.capture import SceneFormatError
from lift3d.imaging import open_image

T = Image.Transpose
# EXIF orientation tag value -> the transpose that makes the stored pixels upright
_UPRIGHT = {2: T.FLIP_LEFT_RIGHT, 3: T.ROTATE_180, 4: T.FLIP_TOP_BOTTOM, 5: T.TRANSPOSE, 6: T.ROTATE_270,
            7: T.TRANSVERSE, 8: T.ROTATE_90}


def _to_8bit(image: Image.Image) -> Image.Image:
    """16-bit and 32-bit single-channel images scaled to 8 bits (Pillow's own conversion clips instead)."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        values = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") or values.max() > 255 else 255.0
        return Image.fromarray((np.clip(values / top, 0, 1) * 255 + 0.5).astype(np.uint8), "L")
    return image


def _open(path: Path) -> Image.Image:
    """The decoded image, its size checked against ``PHOTO_PIXELS`` before decoding; a truncated or unreadable file
    is named as such."""
    try:
        image = open_image(path, str(path), SceneFormatError)
        image.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        if isinstance(error, SceneFormatError):
            raise
        if "truncated" in str(error):
            raise SceneFormatError(f"{path} is cut short (a truncated file: {error}); copy it again from the camera "
                                   "or leave it out") from None
        raise SceneFormatError(f"cannot read the image {path}: {error}") from None
    return image


def _read_16bit_color(path: Path) -> np.ndarray | None:
    """A 16-bit-per-channel color PNG/TIFF read at full depth through OpenCV (Pillow reduces them), as 8 bits."""
    import cv2

    data = cv2.imread(str(path), cv2.IMREAD_UNCHANGED | cv2.IMREAD_IGNORE_ORIENTATION)
    if data is None or data.dtype != np.uint16 or data.ndim != 3:
        return None
    data = cv2.cvtColor(data, cv2.COLOR_BGRA2RGBA if data.shape[2] == 4 else cv2.COLOR_BGR2RGB)
    return (data.astype(np.float64) / 65535.0 * 255.0 + 0.5).astype(np.uint8)


def _is_deep(path: Path, image: Image.Image) -> bool:
    """Whether a color image stores more than 8 bits a channel (a PNG's header says; TIFFs are asked of OpenCV)."""
    if image.format == "PNG":
        with open(path, "rb") as f:
            header = f.read(25)
        return len(header) == 25 and header[24] == 16
    return image.format == "TIFF"


def load_rgba(path: str | Path, downscale: int = 1) -> np.ndarray:
    """The image at ``path`` as ``[H, W, 4] uint8`` RGBA, upright (EXIF orientation applied), reduced by
    ``downscale`` (box filter)."""
    path = Path(path)
    image = _open(path)
    exif_orientation = image.getexif().get(0x0112, 1)
    deep = _read_16bit_color(path) if image.mode in ("RGB", "RGBA") and _is_deep(path, image) else None
    if deep is not None:
        image = Image.fromarray(deep)
    if exif_orientation in _UPRIGHT:
        image = image.transpose(_UPRIGHT[exif_orientation])
    image = _to_8bit(image)
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode == "LA":
        image = image.convert("RGBA")
    image = image.convert("RGBA")
    if downscale > 1:
        image = image.resize((max(1, image.width // downscale), max(1, image.height // downscale)), Image.Resampling.BOX)
    return np.asarray(image, dtype=np.uint8)


def load_mask(path: str | Path, size: tuple[int, int]) -> np.ndarray:
    """A mask image as ``[H, W] uint8`` (255 = keep), resized to ``size`` = (width, height)."""
    rgba = load_rgba(path)
    mask = rgba[..., 3] if (rgba[..., 3] < 255).any() else rgba[..., :3].max(-1)
    image = Image.fromarray(mask)
    if image.size != size:
        image = image.resize(size, Image.Resampling.BOX)
    return np.asarray(image, dtype=np.uint8)

"""Image conversions shared by saving and exports: tensors -> uint8 frames, color maps, grids; and the one way
lift3d opens an image file (``open_image``: its size checked against a limit before a pixel is decoded)."""

from __future__ import annotations

import threading
from typing import IO

import numpy as np
import torch
from torch import Tensor

from lift3d.limits import PHOTO_PIXELS, Limit

_PILLOW_LIMIT = threading.Lock()  # Pillow's own bomb check is one global: lifted for one header read at a time

# control points of a perceptually ordered color map (dark blue -> teal -> yellow), for depth
_COLORMAP = np.array(
    [[0.267, 0.005, 0.329], [0.231, 0.322, 0.546], [0.129, 0.565, 0.551], [0.369, 0.789, 0.383], [0.993, 0.906, 0.144]],
    dtype=np.float32,
)


def to_numpy_image(image: Tensor | np.ndarray) -> np.ndarray:
    """[H, W, C] float (0..1) or uint8 -> uint8 [H, W, C]; a batch of one is squeezed."""
    if isinstance(image, Tensor):
        image = image.detach().float().cpu().numpy()
    if image.ndim == 4 and image.shape[0] == 1:
        image = image[0]
    if image.ndim == 2:
        image = image[..., None]
    if image.dtype == np.uint8:
        return image
    return (np.clip(np.nan_to_num(image, nan=0.0), 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def colormap(values: np.ndarray) -> np.ndarray:
    """Map values in [0, 1] [H, W] to RGB [H, W, 3] float."""
    x = np.clip(values, 0.0, 1.0) * (len(_COLORMAP) - 1)
    low = np.floor(x).astype(int).clip(0, len(_COLORMAP) - 2)
    frac = (x - low)[..., None]
    return _COLORMAP[low] * (1 - frac) + _COLORMAP[low + 1] * frac


def depth_to_rgb(depth: Tensor | np.ndarray, mask: Tensor | np.ndarray | None = None) -> np.ndarray:
    """Depth [H, W(, 1)] -> color-mapped uint8 [H, W, 3], normalized over the masked pixels."""
    d = depth.detach().float().cpu().numpy() if isinstance(depth, Tensor) else np.asarray(depth, np.float32)
    d = d.reshape(d.shape[0], d.shape[1])
    m = np.isfinite(d)
    if mask is not None:
        mm = mask.detach().cpu().numpy() if isinstance(mask, Tensor) else np.asarray(mask)
        m &= mm.reshape(d.shape) > 0.5
    if m.any():
        lo, hi = d[m].min(), d[m].max()
        normalized = (d - lo) / max(hi - lo, 1e-8)
    else:
        normalized = np.zeros_like(d)
    rgb = colormap(normalized)
    rgb[~m] = 0.0
    return to_numpy_image(rgb)


def normal_to_rgb(normal: Tensor | np.ndarray) -> np.ndarray:
    """Unit normals in [-1, 1] [H, W, 3] -> uint8 [H, W, 3] via (n + 1) / 2."""
    n = normal.detach().float().cpu().numpy() if isinstance(normal, Tensor) else np.asarray(normal, np.float32)
    return to_numpy_image((n + 1.0) * 0.5)


def grayscale_to_rgb(values: Tensor | np.ndarray) -> np.ndarray:
    """Values in [0, 1] [H, W(, 1)] -> uint8 [H, W, 3] gray."""
    v = to_numpy_image(values)
    return np.repeat(v[..., :1], 3, axis=-1)


def panel_to_rgb(kind: str, image: Tensor | np.ndarray, mask: Tensor | np.ndarray | None = None) -> np.ndarray:
    """One grid panel as uint8 RGB; ``kind`` is rgb, grayscale (alpha/opacity), depth or normal."""
    if kind == "rgb":
        out = to_numpy_image(image)
        return out[..., :3] if out.shape[-1] >= 3 else np.repeat(out, 3, axis=-1)
    if kind == "grayscale":
        return grayscale_to_rgb(image)
    if kind == "depth":
        return depth_to_rgb(image, mask)
    if kind == "normal":
        return normal_to_rgb(image)
    raise ValueError(f"unknown panel kind {kind!r}; use rgb, grayscale, depth or normal")


def hstack_panels(panels: list[np.ndarray], gap: int = 4) -> np.ndarray:
    """Panels side by side with white gaps; panels of other heights are padded at the bottom."""
    height = max(p.shape[0] for p in panels)
    parts = []
    for i, panel in enumerate(panels):
        if panel.shape[0] < height:
            pad = np.full((height - panel.shape[0],) + panel.shape[1:], 255, np.uint8)
            panel = np.concatenate([panel, pad], axis=0)
        if i:
            parts.append(np.full((height, gap, 3), 255, np.uint8))
        parts.append(panel)
    return np.concatenate(parts, axis=1)


def as_hwc(image: Tensor) -> Tensor:
    """[B, H, W, C] or [H, W, C] -> [H, W, C] (the first of a batch)."""
    return image[0] if image.ndim == 4 else image


def premultiply_on(rgba: Tensor, background: Tensor) -> Tensor:
    """Composite straight-alpha RGBA [..., 4] over ``background`` [..., 3] -> RGB [..., 3]."""
    alpha = rgba[..., 3:4]
    return rgba[..., :3] * alpha + background * (1.0 - alpha)


def to_tensor_image(array: np.ndarray) -> Tensor:
    """uint8 [H, W, C] -> float [H, W, C] in 0..1."""
    return torch.from_numpy(np.ascontiguousarray(array)).float() / 255.0


def open_image(source: str | IO[bytes], name: str, error: type[Exception], limit: Limit = PHOTO_PIXELS,
               fix: str = "downscale it (e.g. to 8000 pixels a side)"):
    """The image at ``source`` opened lazily (Pillow reads the header only: nothing is decoded), refused with
    ``error`` (the caller's user error) naming ``name``, its size, the ``limit`` and ``fix`` when it holds more
    pixels than the limit. Pillow's own decompression-bomb check gives way to the limit (it would raise its own
    error, or warn, without naming the file or the fix); unreadable files raise what ``PIL.Image.open`` raises."""
    from PIL import Image

    with _PILLOW_LIMIT:
        saved = Image.MAX_IMAGE_PIXELS
        Image.MAX_IMAGE_PIXELS = None
        try:
            image = Image.open(source)
        finally:
            Image.MAX_IMAGE_PIXELS = saved
    width, height = image.size
    if limit.exceeded(width * height):
        image.close()
        limit.check(name, width * height, error, fix, detail=f"{width} x {height} px")
    return image

"""One photo made into the reference view of image-to-3D: the object cut out, centered and scaled.

Pure functions on arrays. The cut-out comes from the photo's alpha when it has one, else from ``rembg``
(the optional extra ``lift3d[segment]``), else from the plain background color (the color of the
border, flooded in from the edges), which works for studio shots and renders.
"""

from __future__ import annotations

import logging

import numpy as np
from PIL import Image

log = logging.getLogger("lift3d.data")
BACKGROUND_REMOVAL = ("auto", "alpha", "rembg", "plain", "none")


class ReferenceImageError(ValueError):
    """A reference photo lift3d cannot cut out; the message says what to give instead."""


class SegmentationMissingError(ReferenceImageError):
    """``rembg`` was asked for but is not installed."""


def rembg_alpha(rgb: np.ndarray) -> np.ndarray:
    """The object mask [H, W] uint8 of an RGB photo [H, W, 3] uint8 by rembg (its default U2-Net model)."""
    try:
        import rembg
    except ImportError:
        raise SegmentationMissingError(
            "background removal with rembg needs the optional extra: pip install 'lift3d[segment]' "
            "(or give an RGBA image with the object cut out, or data.background_removal=plain for a photo on a plain "
            "background)") from None
    cut = np.asarray(rembg.remove(Image.fromarray(rgb)))
    return cut[..., 3].astype(np.uint8)


def plain_background_alpha(rgb: np.ndarray, tolerance: float = 0.12) -> np.ndarray:
    """The object mask [H, W] uint8 of a photo on a plain background: pixels reachable from the border through
    colors within ``tolerance`` (0..1, RGB distance) of the border's median color are background."""
    from scipy import ndimage

    image = rgb.astype(np.float32) / 255.0
    border = np.concatenate([image[0], image[-1], image[:, 0], image[:, -1]])
    color = np.median(border, axis=0)
    close = np.linalg.norm(image - color, axis=-1) < tolerance
    labels, _ = ndimage.label(close)
    edge_labels = np.unique(np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]]))
    background = np.isin(labels, edge_labels[edge_labels > 0])
    foreground = ndimage.binary_opening(~background, iterations=1)
    return (foreground * 255).astype(np.uint8)


def cut_out(rgba: np.ndarray, method: str = "auto") -> np.ndarray:
    """``rgba`` [H, W, 4] uint8 with its alpha set by ``method`` (see the module docstring); ``auto`` keeps a
    real alpha channel, else tries rembg and falls back to the plain-background cut with one log line."""
    if method not in BACKGROUND_REMOVAL:
        raise ReferenceImageError(f"data.background_removal must be one of {', '.join(BACKGROUND_REMOVAL)}, got {method!r}")
    has_alpha = bool((rgba[..., 3] < 255).any())
    if method == "none" or (method in ("auto", "alpha") and has_alpha):
        return rgba
    if method == "alpha":
        raise ReferenceImageError("data.background_removal=alpha but the image has no transparent pixels: give an RGBA cut-out")
    rgb = np.ascontiguousarray(rgba[..., :3])
    if method == "rembg":
        alpha = rembg_alpha(rgb)
    elif method == "plain":
        alpha = plain_background_alpha(rgb)
    else:
        try:
            alpha = rembg_alpha(rgb)
        except SegmentationMissingError:
            log.info("rembg is not installed (pip install 'lift3d[segment]'): cutting the object out of its plain "
                     "background color instead")
            alpha = plain_background_alpha(rgb)
    if not (alpha > 127).any():
        raise ReferenceImageError("no object found in the reference image: give an RGBA cut-out, or a photo of the object on a "
                         "plain background")
    return np.concatenate([rgb, alpha[..., None]], axis=-1)


def recenter(rgba: np.ndarray, size: int, object_size: float) -> np.ndarray:
    """The cut-out [H, W, 4] as a ``size`` x ``size`` image whose object (alpha > 0.5) is centered and spans
    ``object_size`` of the side (DreamGaussian's preprocessing); ``object_size`` 0 only resizes."""
    if object_size <= 0:
        return np.asarray(Image.fromarray(rgba, "RGBA").resize((size, size), Image.Resampling.LANCZOS))
    ys, xs = np.nonzero(rgba[..., 3] > 127)
    if len(xs) == 0:
        raise ReferenceImageError("the reference image's alpha is empty: there is no object to center")
    y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
    crop = rgba[y0:y1, x0:x1]
    side = max(y1 - y0, x1 - x0)
    inner = max(1, round(size * object_size))
    scale = inner / side
    h, w = max(1, round((y1 - y0) * scale)), max(1, round((x1 - x0) * scale))
    # resize premultiplied colors so the transparent surround does not bleed into the edges
    premultiplied = crop.astype(np.float32)
    premultiplied[..., :3] *= premultiplied[..., 3:] / 255.0
    resized = np.stack([np.asarray(Image.fromarray(premultiplied[..., c]).resize((w, h), Image.Resampling.LANCZOS))
                        for c in range(4)], -1).clip(0, 255)
    alpha = resized[..., 3:]
    resized[..., :3] = np.where(alpha > 0, resized[..., :3] * 255.0 / np.maximum(alpha, 1e-6), 0)
    out = np.zeros((size, size, 4), np.float32)
    top, left = (size - h) // 2, (size - w) // 2
    out[top:top + h, left:left + w] = resized
    return (out + 0.5).clip(0, 255).astype(np.uint8)

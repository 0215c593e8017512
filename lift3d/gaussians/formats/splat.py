"""The compact ``.splat`` format of web Gaussian-splat viewers (antimatter15/splat and the readers that
followed it, e.g. PlayCanvas splat-transform): 32 bytes per Gaussian, no header, little-endian:

    offset  size  field
    0       12    position x, y, z        float32 x 3
    12      12    scale sx, sy, sz        float32 x 3, activated (standard deviations, not log)
    24      4     color r, g, b, a       uint8 x 4: round(255 * rgb) clamped; a = round(255 * opacity)
    28      4     rotation w, x, y, z     uint8 x 4: round(128 * q / |q| + 128) clamped to 0..255

Gaussians are written most visible first (scale volume x opacity, descending), the order viewers
expect when they stream the file. The file holds only the view-independent color (SH degree 0):
pass rgb = 0.5 + Y0 * sh_dc (``rgb_from_sh_dc``). Positions are lift3d world coordinates.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lift3d.gaussians.formats.codec import PlyFormatError, check_count, finite_gaussians, read_file, register_codec, write_file
from lift3d.gaussians.tensors import GaussianTensors
from lift3d.sh import rgb_to_sh, sh_to_rgb

SPLAT_DTYPE = np.dtype(
    [("position", "<f4", (3,)), ("scale", "<f4", (3,)), ("rgba", "u1", (4,)), ("rotation", "u1", (4,))]
)
assert SPLAT_DTYPE.itemsize == 32


def rgb_from_sh_dc(sh_dc: Tensor) -> Tensor:
    """View-independent color [N, 3] from the degree-0 SH coefficients [N, 3] (or [N, 1, 3])."""
    return sh_to_rgb(sh_dc.reshape(sh_dc.shape[0], 3)).clamp(0.0, 1.0)


def _numpy(t: Tensor | np.ndarray) -> np.ndarray:
    return t.detach().float().cpu().numpy() if isinstance(t, Tensor) else np.asarray(t, dtype=np.float32)


def _quantize(values: np.ndarray, scale: float, offset: float) -> np.ndarray:
    return np.clip(np.round(values * scale + offset), 0, 255).astype(np.uint8)


def splat_records(gaussians: GaussianTensors, sort: bool = True) -> np.ndarray:
    """The ``.splat`` records [N] (structured, 32 bytes each) of the Gaussians."""
    if gaussians.colors is None:
        raise ValueError("a .splat file needs colors: pass GaussianTensors(colors=rgb_from_sh_dc(sh_dc))")
    means, scales, quats = _numpy(gaussians.means), _numpy(gaussians.scales), _numpy(gaussians.quats)
    opacities, colors = _numpy(gaussians.opacities), _numpy(gaussians.colors)
    records = np.empty(len(means), dtype=SPLAT_DTYPE)
    records["position"] = means
    records["scale"] = scales
    records["rgba"][:, :3] = _quantize(colors, 255.0, 0.0)
    records["rgba"][:, 3] = _quantize(opacities, 255.0, 0.0)
    norm = np.linalg.norm(quats, axis=1, keepdims=True)
    unit = np.where(norm > 0, quats / np.maximum(norm, 1e-30), np.array([1.0, 0.0, 0.0, 0.0]))
    records["rotation"] = _quantize(unit, 128.0, 128.0)
    if sort:
        importance = np.prod(scales.astype(np.float64), axis=1) * opacities
        records = records[np.argsort(-importance, kind="stable")]
    return records


def write_splat(path: str | Path, gaussians: GaussianTensors, sort: bool = True) -> list[Path]:
    """Write the Gaussians as a ``.splat`` file (layout in the module docstring); returns [path]."""
    return [write_file(path, splat_records(gaussians, sort).tobytes())]


def decode_splat(data: bytes, name: str = "the data") -> dict[str, Tensor]:
    """A ``.splat`` file's activated values: means, scales, unit quats (wxyz), opacities and colors in 0..1
    (quantized color, opacity and rotation come back to within 1/255)."""
    if len(data) % SPLAT_DTYPE.itemsize or not data:
        raise PlyFormatError(f"{name} is not a .splat file: its size {len(data)} is not a positive multiple of 32 bytes")
    check_count(len(data) // SPLAT_DTYPE.itemsize, name)
    records = np.frombuffer(data, dtype=SPLAT_DTYPE)
    rgba = records["rgba"].astype(np.float32) / 255.0
    return finite_gaussians({
        "means": torch.from_numpy(records["position"].copy()),
        "scales": torch.from_numpy(records["scale"].copy()),
        "quats": torch.from_numpy((records["rotation"].astype(np.float32) - 128.0) / 128.0),
        "opacities": torch.from_numpy(rgba[:, 3].copy()),
        "colors": torch.from_numpy(rgba[:, :3].copy()),
    }, name)


def read_splat(path: str | Path) -> GaussianTensors:
    """Decode a ``.splat`` file into activated Gaussians (see ``decode_splat``)."""
    values = decode_splat(read_file(path, "Gaussian file"), str(path))
    return GaussianTensors(means=values["means"], scales=values["scales"], quats=values["quats"],
                           opacities=values["opacities"], colors=values["colors"])


def load_splat(path: str | Path) -> dict[str, Tensor]:
    """Pre-activation parameters of a ``.splat`` file (SH degree 0: its colors), as every codec's ``load_*``."""
    values = decode_splat(read_file(path, "Gaussian file"), str(path))
    return {"means": values["means"], "log_scales": values["scales"].clamp_min(1e-12).log(), "quats": values["quats"],
            "opacity_logits": torch.logit(values["opacities"], eps=1e-4), "sh0": rgb_to_sh(values["colors"])[:, None, :],
            "shN": torch.zeros(len(values["means"]), 0, 3)}


register_codec(".splat", load_splat, None, "the compact .splat of web viewers (written from activated Gaussians: write_splat)")

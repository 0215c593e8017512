"""Gaussian files made by other tools, as model parameters: the 3DGS .ply (``lift3d.gaussians.formats.ply``), the
compact ``.splat`` of web viewers (32 bytes a Gaussian; its layout is documented in ``lift3d.gaussians.formats.splat``),
Niantic's ``.spz`` (``lift3d.gaussians.formats.spz``), PlayCanvas's bundled ``.sog`` (``lift3d.gaussians.formats.sog``), glTF
``.glb`` with ``KHR_gaussian_splatting`` (``lift3d.gaussians.formats.gltf``) and GaussianSplats3D's ``.ksplat``
(``lift3d.gaussians.formats.ksplat``), chosen by the file's suffix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lift3d.gaussians.formats.gltf import load_gltf_splat
from lift3d.gaussians.formats.ksplat import load_ksplat
from lift3d.gaussians.formats.ply import PlyFormatError, load_ply
from lift3d.gaussians.formats.sog import load_sog
from lift3d.gaussians.formats.spz import load_spz
from lift3d.render.splats.sh import rgb_to_sh

SPLAT_DTYPE = np.dtype(
    [("position", "<f4", (3,)), ("scale", "<f4", (3,)), ("rgba", "u1", (4,)), ("rotation", "u1", (4,))]
)
assert SPLAT_DTYPE.itemsize == 32
# suffix -> reader of the compact formats; each reader returns parameters in lift3d's world
READERS = {".spz": load_spz, ".sog": load_sog, ".glb": load_gltf_splat, ".ksplat": load_ksplat}


def decode_splat(path: str | Path) -> dict[str, Tensor]:
    """A ``.splat`` file's activated values: means, scales, unit quats (wxyz), opacities and colours in 0..1
    (quantised colour, opacity and rotation come back to within 1/255)."""
    data = Path(path).read_bytes()
    if len(data) % SPLAT_DTYPE.itemsize or not data:
        raise PlyFormatError(f"{path} is not a .splat file: its size {len(data)} is not a positive multiple of 32 bytes")
    records = np.frombuffer(data, dtype=SPLAT_DTYPE)
    rgba = records["rgba"].astype(np.float32) / 255.0
    return {
        "means": torch.from_numpy(records["position"].copy()),
        "scales": torch.from_numpy(records["scale"].copy()),
        "quats": torch.from_numpy((records["rotation"].astype(np.float32) - 128.0) / 128.0),
        "opacities": torch.from_numpy(rgba[:, 3].copy()),
        "colours": torch.from_numpy(rgba[:, :3].copy()),
    }


def load_gaussian_file(path: str | Path) -> dict[str, Tensor]:
    """Pre-activation parameters (``means``, ``log_scales``, ``quats``, ``opacity_logits``, ``sh0``, ``shN``) of a
    3DGS .ply, .spz, .sog, .ksplat or KHR_gaussian_splatting .glb (each with its own SH degree) or a .splat (SH degree 0:
    its colours), all in lift3d's world."""
    params = _read_gaussian_file(Path(path))
    if len(params["means"]) == 0:
        raise PlyFormatError(f"{path} holds no Gaussians (0 vertices): there is nothing to convert or show; write it "
                             "again from the tool that made it (an empty scene, or an export that failed)")
    return params


def _read_gaussian_file(path: Path) -> dict[str, Tensor]:
    suffix = path.suffix.lower()
    if suffix in READERS:
        return READERS[suffix](path)
    if suffix != ".splat":
        return load_ply(path)
    if not path.is_file():
        raise FileNotFoundError(f"Gaussian file not found: {path}")
    values = decode_splat(path)
    return {"means": values["means"], "log_scales": values["scales"].clamp_min(1e-12).log(), "quats": values["quats"],
            "opacity_logits": torch.logit(values["opacities"], eps=1e-4), "sh0": rgb_to_sh(values["colours"])[:, None, :],
            "shN": torch.zeros(len(values["means"]), 0, 3)}

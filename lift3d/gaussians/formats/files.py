"""Gaussian files made by other tools, as model parameters, read by the codec their suffix names: the 3DGS .ply
(``ply``, also the default), the compact ``.splat`` of web viewers (``splat``), Niantic's ``.spz`` (``spz``),
PlayCanvas's bundled ``.sog`` (``sog``), glTF ``.glb`` with ``KHR_gaussian_splatting`` (``gltf``) and
GaussianSplats3D's ``.ksplat`` (``ksplat``), PlayCanvas's streamed SOG (``lod-meta.json`` or its folder) and
unbundled SOG (``meta.json``) (``sog_lod``), all modules of ``lift3d.gaussians.formats``."""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from lift3d.gaussians.formats.gltf import load_gltf_splat
from lift3d.gaussians.formats.ksplat import load_ksplat
from lift3d.gaussians.formats.ply import PlyFormatError, load_ply
from lift3d.gaussians.formats.sog import load_sog
from lift3d.gaussians.formats.sog_lod import bundle_meta, load_sog_json
from lift3d.gaussians.formats.splat import load_splat
from lift3d.gaussians.formats.spz import load_spz

# suffix -> reader of the compact formats; each reader returns parameters in lift3d's world
READERS = {".spz": load_spz, ".sog": load_sog, ".glb": load_gltf_splat, ".ksplat": load_ksplat, ".splat": load_splat,
           ".json": load_sog_json}  # .json: a streamed SOG's lod-meta.json (or its folder), an unbundled SOG's meta.json


def load_gaussian_file(path: str | Path) -> dict[str, Tensor]:
    """Pre-activation parameters (``means``, ``log_scales``, ``quats``, ``opacity_logits``, ``sh0``, ``shN``) of a
    3DGS .ply, .spz, .sog, .ksplat or KHR_gaussian_splatting .glb (each with its own SH degree) or a .splat (SH degree 0:
    its colors), all in lift3d's world."""
    path = Path(path)
    if path.is_dir():  # a streamed SOG given as its folder
        path = bundle_meta(path) or path
    params = READERS.get(path.suffix.lower(), load_ply)(path)
    if len(params["means"]) == 0:
        raise PlyFormatError(f"{path} holds no Gaussians (0 vertices): there is nothing to convert or show; write it "
                             "again from the tool that made it (an empty scene, or an export that failed)")
    return params

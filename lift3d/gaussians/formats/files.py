"""Gaussian files made by other tools, read (and written) by the codec their suffix names in the registry
(``lift3d.registry``, kind ``gaussian-codec``): the 3DGS .ply (``ply``, also the reader of a suffix no codec claims),
the compact ``.splat`` of web viewers (``splat``), Niantic's ``.spz`` (``spz``), PlayCanvas's bundled ``.sog``
(``sog``), glTF ``.glb`` with ``KHR_gaussian_splatting`` (``gltf``), GaussianSplats3D's ``.ksplat`` (``ksplat``) and
PlayCanvas's streamed SOG (``lod-meta.json`` or its folder) and unbundled SOG (``meta.json``) (``sog_lod``), all
modules of ``lift3d.gaussians.formats``, and any codec a plugin package registers."""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from lift3d.gaussians.formats.codec import GaussianCodec
from lift3d.gaussians.formats.ply import PlyFormatError
from lift3d.registry import GAUSSIAN_CODEC, RegistryError, closest, entries

DEFAULT_SUFFIX = ".ply"  # the codec of a file whose suffix no codec claims


def codecs() -> dict[str, GaussianCodec]:
    """suffix -> codec, every registered one (lift3d's and plugins')."""
    return entries(GAUSSIAN_CODEC)


def reader_suffixes() -> tuple[str, ...]:
    """The suffixes of every Gaussian file lift3d reads, sorted (".glb", ".ksplat", ".ply", ...)."""
    return tuple(sorted(codecs()))


def writer_suffixes() -> tuple[str, ...]:
    """The suffixes ``save_gaussian_file`` writes, sorted."""
    return tuple(sorted(suffix for suffix, codec in codecs().items() if codec.write is not None))


def load_gaussian_file(path: str | Path) -> dict[str, Tensor]:
    """Pre-activation parameters (``means``, ``log_scales``, ``quats``, ``opacity_logits``, ``sh0``, ``shN``) of a
    3DGS .ply, .spz, .sog, .ksplat or KHR_gaussian_splatting .glb (each with its own SH degree), a .splat (SH degree 0:
    its colors) or a plugin's format, all in lift3d's world."""
    path = Path(path)
    if path.is_dir():  # a streamed SOG given as its folder
        from lift3d.gaussians.formats.sog_lod import bundle_meta

        path = bundle_meta(path) or path
    table = codecs()
    params = table.get(path.suffix.lower(), table[DEFAULT_SUFFIX]).read(path)
    if len(params["means"]) == 0:
        raise PlyFormatError(f"{path} holds no Gaussians (0 vertices): there is nothing to convert or show; write it "
                             "again from the tool that made it (an empty scene, or an export that failed)")
    return params


def save_gaussian_file(path: str | Path, params: dict[str, Tensor], keep: Tensor | None = None,
                       sh_degree: int | None = None, **options) -> Path:
    """Write pre-activation parameters in the format ``path``'s suffix names (``keep`` [N] bool selects Gaussians,
    ``sh_degree`` cuts SH bands, ``options`` go to the codec's writer); returns the file written."""
    path = Path(path)
    suffix = path.suffix.lower()
    codec = codecs().get(suffix)
    if codec is None or codec.write is None:
        near = closest(suffix, list(writer_suffixes()))
        hint = f" (did you mean {near}?)" if near and codec is None else ""
        raise RegistryError(f"lift3d writes no Gaussian file with the suffix {suffix or '(none)'!r} ({path}){hint}; "
                            f"it writes {', '.join(writer_suffixes())}")
    return codec.write(path, params, keep=keep, sh_degree=sh_degree, **options)

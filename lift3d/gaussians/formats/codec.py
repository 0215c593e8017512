"""What every Gaussian codec shares: a file's bytes in (a missing file named as such) and out (written atomically),
and its registration by suffix.

Each codec module holds ``encode_<format>(params) -> bytes`` / ``decode_<format>(data, name) -> params`` and
``save_<format>`` / ``load_<format>`` on paths built from these two functions, and ends with ``register_codec``: its
suffixes with its reader and writer enter the registry (``lift3d.registry``, kind ``gaussian-codec``, one entry a
suffix), which ``lift3d.gaussians.formats.files`` reads. A plugin package registers a codec the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from lift3d.registry import GAUSSIAN_CODEC, calling_module, register_entry
from lift3d.saving import atomic_write_bytes


@dataclass(frozen=True)
class GaussianCodec:
    """A Gaussian file format by suffix: its reader and, where lift3d writes it, its writer (pre-activation
    parameters in lift3d's world both ways)."""

    suffix: str  # ".spz": lower case, with the dot
    read: Callable[[Path], dict[str, Tensor]]  # path -> parameters (means, log_scales, quats, opacity_logits, sh0, shN)
    write: Callable[..., Path] | None = None  # (path, params, keep=mask, sh_degree=int, **options) -> the file written
    description: str = ""  # what the file is, for messages


def register_codec(suffixes: str | tuple[str, ...], read: Callable[[Path], dict[str, Tensor]],
                   write: Callable[..., Path] | None = None, description: str = "") -> None:
    """Register the codec of ``suffixes`` (".spz" or several): ``read`` and ``write`` (None: read only)."""
    for suffix in (suffixes,) if isinstance(suffixes, str) else suffixes:
        suffix = suffix.lower() if suffix.startswith(".") else f".{suffix.lower()}"
        register_entry(GAUSSIAN_CODEC, suffix, GaussianCodec(suffix, read, write, description), owner=calling_module())


def read_file(path: str | Path, kind: str) -> bytes:
    """The bytes of ``path``; FileNotFoundError naming the ``kind`` of file ("SPZ file") when it is missing."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{kind} not found: {path}")
    return path.read_bytes()


def write_file(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (a reader never sees half a file); returns the path."""
    path = Path(path)
    atomic_write_bytes(path, data)
    return path

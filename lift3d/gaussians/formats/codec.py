"""What every Gaussian codec shares: a file's bytes in (a missing file named as such) and out (written atomically),
and its registration by suffix, and the checks every reader makes of what it reads.

Each codec module holds ``encode_<format>(params) -> bytes`` / ``decode_<format>(data, name) -> params`` and
``save_<format>`` / ``load_<format>`` on paths built from these two functions, and ends with ``register_codec``: its
suffixes with its reader and writer enter the registry (``lift3d.registry``, kind ``gaussian-codec``, one entry a
suffix), which ``lift3d.gaussians.formats.files`` reads. A plugin package registers a codec the same way.

Files come from anywhere, so every reader checks them the same way, before it allocates: the file's size
(``GAUSSIAN_FILE_BYTES``), the Gaussian count its header claims (``GAUSSIANS``), and every compressed stream is
inflated at most to the size that count implies (``inflate_gzip``). Gaussians holding NaN or infinite values
(a training run that diverged, a broken writer) are one policy for every format (``finite_gaussians``): they are
left out with one warning that counts them, and a file in which every Gaussian is so is refused as corrupt.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from lift3d.limits import GAUSSIAN_FILE_BYTES, GAUSSIANS
from lift3d.registry import GAUSSIAN_CODEC, calling_module, register_entry
from lift3d.saving import atomic_write_bytes

log = logging.getLogger("lift3d.gaussians")


class PlyFormatError(ValueError):
    """A Gaussian file (a PLY, or any other codec's: each subclasses this) that is not readable; the message says what
    is wrong."""


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
    """The bytes of ``path``; FileNotFoundError naming the ``kind`` of file ("SPZ file") when it is missing, and a
    file over ``GAUSSIAN_FILE_BYTES`` refused before it is read."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{kind} not found: {path}")
    check_file_size(path)
    return path.read_bytes()


def check_file_size(path: Path) -> None:
    GAUSSIAN_FILE_BYTES.check(str(path), path.stat().st_size, PlyFormatError, "keep fewer Gaussians in it")


def check_count(count: int, name: str) -> None:
    """Refuse a header's Gaussian count that is negative or over ``GAUSSIANS``, before anything of that size exists."""
    if count < 0:
        raise PlyFormatError(f"{name} is corrupt: its header counts {count} Gaussians")
    GAUSSIANS.check(name, count, PlyFormatError, "keep fewer Gaussians in it (e.g. prune by opacity in the tool that "
                    "made it)")


def inflate_gzip(data: bytes, limit: int, name: str) -> bytes:
    """A gzip stream's content (every member), refused (PlyFormatError) once it passes ``limit`` bytes: a small
    file that inflates without end (a gzip bomb) never fills the memory."""
    out, rest = bytearray(), data
    while rest:
        stream = zlib.decompressobj(wbits=31)
        try:
            out += stream.decompress(rest, limit + 1 - len(out))
        except zlib.error as error:
            raise PlyFormatError(f"{name} is not a complete gzip stream ({error})") from None
        if len(out) > limit:
            raise PlyFormatError(f"{name} is corrupt: it inflates past the {limit:,} bytes its header implies (a gzip "
                                 "bomb, or a broken file); write it again from the tool that made it")
        if not stream.eof:
            raise PlyFormatError(f"{name} is truncated: not a complete gzip stream (it ends early)")
        rest = stream.unused_data.lstrip(b"\0")
    return bytes(out)


def finite_gaussians(params: dict[str, Tensor], name: str) -> dict[str, Tensor]:
    """``params`` without the Gaussians holding NaN or infinite values (any parameter), which are counted in one
    warning; a file in which every Gaussian is so is refused (PlyFormatError): nothing of it can be shown."""
    n = len(params["means"])
    if n == 0:
        return params
    bad = torch.zeros(n, dtype=torch.bool)
    for value in params.values():
        if value.numel():
            bad |= ~torch.isfinite(value.reshape(n, -1)).all(dim=1)
    if not bad.any():
        return params
    if bad.all():
        raise PlyFormatError(f"{name} is corrupt: all {n:,} of its Gaussians hold NaN or infinite values (a diverged "
                             "training run, or a broken writer); write it again from the tool that made it")
    log.warning("%s: %s of its %s Gaussians hold NaN or infinite values and are left out", name, f"{int(bad.sum()):,}",
                f"{n:,}")
    return {key: value[~bad] for key, value in params.items()}


def write_file(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (a reader never sees half a file); returns the path."""
    path = Path(path)
    atomic_write_bytes(path, data)
    return path

"""What every Gaussian codec shares: a file's bytes in (a missing file named as such) and out (written atomically).

Each codec module holds ``encode_<format>(params) -> bytes`` / ``decode_<format>(data, name) -> params`` and
``save_<format>`` / ``load_<format>`` on paths built from these two functions.
"""

from __future__ import annotations

from pathlib import Path

from lift3d.saving import atomic_write_bytes


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

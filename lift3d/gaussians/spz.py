"""Niantic's SPZ Gaussian files (github.com/nianticlabs/spz, format version 3), written and read here.

The file is one gzip stream holding a 16-byte little-endian header, then one array per attribute:

    header     magic 0x5053474e ("NGSP") u32, version u32 (3; 2 is read too), point count u32,
               SH degree u8 (0..3), fractional bits u8, flags u8 (bit 0: trained antialiased), reserved u8
    positions  N x 3 signed 24-bit fixed point: value * 2^fractional_bits (12 here: 1/4096 steps)
    alphas     N x u8: round(255 * sigmoid(opacity logit))
    colours    N x 3 u8: round(255 * (0.15 * sh_dc + 0.5))  (the DC coefficient, not the colour)
    scales     N x 3 u8: round(16 * (log scale + 10))
    rotations  N x u32: "smallest three" of the unit xyzw quaternion with its largest component made
               positive: bits 30-31 the largest's index, then 10 bits per other component (in x, y, z, w
               order, first one highest): a sign bit and round(511 * |c| / sqrt(1/2)).  (Version 2:
               N x 3 u8 of x, y, z: round(127.5 * c + 127.5) with w >= 0.)
    SH         N x K x 3 u8 (K = 3, 8, 15 for degree 1..3; per Gaussian, coefficient-major, RGB inner):
               round(128 * c) + 128 snapped to steps of 8 (degree-1 coefficients, 5 bits) or 16 (the rest)

Axes: SPZ stores right-up-back coordinates; 3DGS .ply files (and lift3d's own .ply / .splat, which
hold lift3d's world as is) are read as right-down-front, so positions, rotations and SH are turned
180 degrees about x on the way in and back on the way out, as Niantic's and PlayCanvas's converters
do: `splat-transform x.spz x.ply` gives back lift3d's .ply coordinates.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lift3d.gaussians.ply import PlyFormatError, pruned
from lift3d.gaussians.sh import degree_of
from lift3d.gaussians.transform import FLIP_YZ, rotate_gaussians
from lift3d.saving import atomic_write_bytes

MAGIC = 0x5053474E
VERSION = 3
HEADER = struct.Struct("<IIIBBBB")
FRACTIONAL_BITS = 12
COLOUR_SCALE = 0.15
SH_DIMS = {0: 0, 1: 3, 2: 8, 3: 15}
SQRT1_2 = math.sqrt(0.5)


class SpzFormatError(PlyFormatError):
    """A file that is not a readable SPZ; the message says what is wrong."""


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-6, 1.0 - 1e-6)
    return np.log(p / (1.0 - p))


def _u8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x), 0, 255).astype(np.uint8)


def _fractional_bits(means: np.ndarray) -> int:
    """12 bits (1/4096 steps, what Niantic writes) unless the positions need a wider 24-bit range."""
    extent = float(np.abs(means).max()) if len(means) else 0.0
    bits = FRACTIONAL_BITS
    while bits > 0 and extent * (1 << bits) >= (1 << 23) - 1:
        bits -= 1
    if extent * (1 << bits) >= (1 << 23) - 1:
        raise SpzFormatError(f"positions up to {extent:g} do not fit SPZ's 24-bit fixed point even with 0 fractional bits")
    return bits


def pack_rotations(quats_wxyz: np.ndarray) -> np.ndarray:
    """[N] uint32 smallest-three codes (version 3) of quaternions [N, 4] in wxyz order."""
    q = quats_wxyz[:, [1, 2, 3, 0]].astype(np.float64)  # xyzw, SPZ's order
    q /= np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-30)
    largest = np.abs(q).argmax(axis=1)
    q *= np.where(q[np.arange(len(q)), largest] < 0, -1.0, 1.0)[:, None]
    code = largest.astype(np.uint32)
    for i in range(4):
        other = largest != i
        mag = np.minimum(np.floor(511.0 * np.abs(q[:, i]) / SQRT1_2 + 0.5), 511).astype(np.uint32)
        bits = ((q[:, i] < 0).astype(np.uint32) << 9) | mag
        code = np.where(other, (code << 10) | bits, code)
    return code


def unpack_rotations(code: np.ndarray) -> np.ndarray:
    """Unit quaternions [N, 4] (wxyz) from smallest-three codes [N] (uint32)."""
    code = code.astype(np.uint32)
    largest = (code >> 30).astype(np.int64)
    q = np.zeros((len(code), 4))
    rest = code.copy()
    for i in (3, 2, 1, 0):
        other = largest != i
        value = SQRT1_2 * (rest & 511).astype(np.float64) / 511.0
        value = np.where((rest >> 9) & 1, -value, value)
        q[:, i] = np.where(other, value, 0.0)
        rest = np.where(other, rest >> 10, rest)
    q[np.arange(len(q)), largest] = np.sqrt(np.maximum(0.0, 1.0 - (q * q).sum(axis=1)))
    return q[:, [3, 0, 1, 2]]


def quantize_sh(values: np.ndarray, step: int) -> np.ndarray:
    """SH coefficients to bytes: round(128 c) + 128 snapped to multiples of ``step`` (8 or 16)."""
    q = np.round(values * 128.0) + 128.0
    return np.clip((q + step // 2) // step * step, 0, 255).astype(np.uint8)


def encode_spz(params: dict[str, Tensor], antialiased: bool = False) -> bytes:
    """The gzip-compressed SPZ bytes (version 3) of pre-activation Gaussian parameters in lift3d's world."""
    degree = degree_of(params["shN"].shape[1] + 1)
    p = rotate_gaussians({k: v.detach().float().cpu() for k, v in params.items()}, FLIP_YZ)
    n = len(p["means"])
    means = p["means"].numpy().astype(np.float64)
    bits = _fractional_bits(means)
    fixed = np.round(means * (1 << bits)).astype(np.int32).reshape(-1)
    positions = np.stack([fixed & 0xFF, (fixed >> 8) & 0xFF, (fixed >> 16) & 0xFF], axis=1).astype(np.uint8)
    alphas = _u8(255.0 / (1.0 + np.exp(-p["opacity_logits"].numpy().astype(np.float64))))
    colours = _u8(p["sh0"].reshape(n, 3).numpy() * (COLOUR_SCALE * 255.0) + 127.5)
    scales = _u8((p["log_scales"].numpy() + 10.0) * 16.0)
    rotations = pack_rotations(p["quats"].numpy()).astype("<u4")
    sh = p["shN"].numpy()  # [N, K, 3]: coefficient-major with RGB inner, as SPZ stores them
    sh_bytes = np.concatenate([quantize_sh(sh[:, :3], 8), quantize_sh(sh[:, 3:], 16)], axis=1) if degree else sh.astype(np.uint8)
    header = HEADER.pack(MAGIC, VERSION, n, degree, bits, 1 if antialiased else 0, 0)
    body = b"".join(a.tobytes() for a in (positions, alphas, colours, scales, rotations, sh_bytes))
    return gzip.compress(header + body, compresslevel=9, mtime=0)


def save_spz(path: str | Path, params: dict[str, Tensor], keep: Tensor | None = None, sh_degree: int | None = None) -> Path:
    """Write pre-activation parameters as an .spz file, atomically; ``keep`` [N] (bool) selects Gaussians,
    ``sh_degree`` cuts the SH bands (the file keeps the rest, up to degree 3)."""
    params = pruned(params, keep, sh_degree)
    path = Path(path)
    atomic_write_bytes(path, encode_spz(params))
    return path


def decode_spz(data: bytes, name: str = "the data") -> dict[str, Tensor]:
    """Pre-activation parameters (lift3d's world) of SPZ bytes (gzip stream, versions 2 and 3)."""
    if data[:4] == b"NGSP" and len(data) >= 8:
        version = struct.unpack_from("<I", data, 4)[0]
        raise SpzFormatError(f"{name} is SPZ version {version} (plain header, not one gzip stream); lift3d reads versions "
                             "2 and 3: convert it with `splat-transform --spz-version 3 IN.spz OUT.spz`")
    try:
        raw = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as error:
        raise SpzFormatError(f"{name} is not an SPZ file (not a complete gzip stream: {error})") from None
    if len(raw) < HEADER.size:
        raise SpzFormatError(f"{name} is too short for an SPZ header ({len(raw)} bytes)")
    magic, version, n, degree, bits, flags, _ = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise SpzFormatError(f"{name} is not an SPZ file: magic {magic:#x}, expected {MAGIC:#x} ('NGSP')")
    if version not in (2, 3):
        raise SpzFormatError(f"{name} is SPZ version {version}; lift3d reads versions 2 and 3")
    if degree not in SH_DIMS:
        raise SpzFormatError(f"{name} has SH degree {degree}; SPZ allows 0..3")
    if flags & 2:
        raise SpzFormatError(f"{name} carries SPZ extensions (flag 0x2), which lift3d does not read")
    k, rot_bytes = SH_DIMS[degree], 4 if version >= 3 else 3
    sizes = [9 * n, n, 3 * n, 3 * n, rot_bytes * n, 3 * k * n]
    if len(raw) != HEADER.size + sum(sizes):
        raise SpzFormatError(f"{name} is truncated or corrupt: {len(raw) - HEADER.size} data bytes for {n} Gaussians "
                             f"of SH degree {degree}, expected {sum(sizes)}")
    arrays, offset = [], HEADER.size
    for size in sizes:
        arrays.append(np.frombuffer(raw, dtype=np.uint8, count=size, offset=offset))
        offset += size
    positions, alphas, colours, scales, rotations, sh = arrays
    b = positions.reshape(-1, 3).astype(np.int32)
    fixed = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
    fixed = np.where(fixed & 0x800000, fixed - (1 << 24), fixed)
    if version >= 3:
        quats = unpack_rotations(rotations.view("<u4"))
    else:
        xyz = rotations.reshape(n, 3).astype(np.float64) / 127.5 - 1.0
        quats = np.concatenate([np.sqrt(np.maximum(0.0, 1.0 - (xyz * xyz).sum(1)))[:, None], xyz], axis=1)
    f = np.float32
    params = {
        "means": torch.from_numpy((fixed.reshape(n, 3) / float(1 << bits)).astype(f)),
        "log_scales": torch.from_numpy((scales.reshape(n, 3) / 16.0 - 10.0).astype(f)),
        "quats": torch.from_numpy(quats.astype(f)),
        "opacity_logits": torch.from_numpy(_logit(alphas / 255.0).astype(f)),
        "sh0": torch.from_numpy(((colours.reshape(n, 1, 3) / 255.0 - 0.5) / COLOUR_SCALE).astype(f)),
        "shN": torch.from_numpy(((sh.reshape(n, k, 3).astype(np.float64) - 128.0) / 128.0).astype(f)),
    }
    return rotate_gaussians(params, torch.tensor(FLIP_YZ).T)


def load_spz(path: str | Path) -> dict[str, Tensor]:
    """Pre-activation parameters of an .spz file, in lift3d's world (see the module docstring for the axes)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SPZ file not found: {path}")
    return decode_spz(path.read_bytes(), str(path))

"""The ``.ksplat`` Gaussian files of mkkellogg's GaussianSplats3D (a three.js viewer common on the web), read and
written here.

All numbers little-endian. A 4096-byte header: version u8 major (0), u8 minor (1), then as u32 words (index 1..4)
the section capacity, the section count, the capacity in Gaussians and the Gaussian count; the compression level
u16 at byte 20 (0, 1 or 2); the scene center 3 x f32 at byte 24; the range of 8-bit SH values, min and max f32 at
bytes 36 and 40 (0: -1.5 and 1.5).  Then one 1024-byte header per section: as u32 words the Gaussian count, the
capacity, the bucket capacity, the bucket count, the bucket block size (f32), the bucket record size (u16 at byte
20: 12), the quantization range (word 6: 32767 when 0), the section's byte size, the full and the partly filled
bucket counts (words 8, 9) and the SH degree (u16 at byte 40).  Each section's data: the partly filled buckets'
sizes (u32 each), the bucket centers (3 x f32 each), then per Gaussian (capacity records):

    level 0: position 3 x f32, scale 3 x f32 (linear), rotation 4 x f32 (w, x, y, z), color 4 x u8, SH f32
    level 1: position 3 x u16 (q - range) * block / 2 / range + the bucket's center, scale, rotation and SH f16
    level 2: as level 1 with SH as u8 over [min, max] of the header

with color ``round(255 * clamp(0.5 + C0 sh_dc))`` and alpha ``round(255 * opacity)``; the SH coefficients of each
band are stored channel by channel (band 1: r of m = -1, 0, 1, then g, then b; band 2 likewise), bands 1 to 2 (3 as
splat-transform reads it).  Gaussians fill the full buckets first (each ``bucket capacity`` long), then the partly
filled ones in order.  Positions are the .ply's own coordinates, lift3d's world as is.
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lift3d.gaussians.formats.codec import PlyFormatError, check_count, finite_gaussians, read_file, register_codec, write_file
from lift3d.gaussians.formats.ply import pruned
from lift3d.sh import Y0, degree_of

log = logging.getLogger(__name__)

HEADER_BYTES, SECTION_BYTES = 4096, 1024
BUCKET_RECORD = 12  # a bucket's center, 3 x f32
BUCKET_CAPACITY, BLOCK_SIZE, QUANT_RANGE = 256, 5.0, 32767  # GaussianSplats3D's defaults
SH_COMPONENTS = {0: 0, 1: 9, 2: 24, 3: 45}
WRITABLE_DEGREE = 2  # GaussianSplats3D reads SH bands up to 2
SH_RANGE = 1.5  # the 8-bit SH range when the header leaves it 0


class KsplatFormatError(PlyFormatError):
    """A file that is not a readable .ksplat; the message says what is wrong."""


def _record_dtype(level: int, degree: int) -> np.dtype:
    """The per-Gaussian record of a compression level and SH degree."""
    f = "<f4" if level == 0 else "<f2"
    fields = [("position", "<f4" if level == 0 else "<u2", (3,)), ("scale", f, (3,)), ("rotation", f, (4,)), ("rgba", "u1", (4,))]
    if degree:
        fields.append(("sh", f if level < 2 else "u1", (SH_COMPONENTS[degree],)))
    return np.dtype(fields)


def _sh_order(degree: int) -> np.ndarray:
    """[K * 3] indices into lift3d's [K, 3] (coefficient-major) SH of each stored component (band by band, channel by
    channel within a band)."""
    order = []
    for band in range(1, degree + 1):
        first, width = band * band - 1, 2 * band + 1
        order += [(first + m) * 3 + channel for channel in range(3) for m in range(width)]
    return np.array(order, dtype=np.int64)


def decode_ksplat(data: bytes, name: str = "the data") -> dict[str, Tensor]:
    """Pre-activation parameters (lift3d's world) of .ksplat bytes (compression levels 0 to 2)."""
    if len(data) < HEADER_BYTES:
        raise KsplatFormatError(f"{name} is too short for a .ksplat header ({len(data)} bytes, the header alone is 4096)")
    major, minor = data[0], data[1]
    if major != 0 or minor < 1:
        raise KsplatFormatError(f"{name} is not a .ksplat file this reader knows: version {major}.{minor}, expected 0.1 or "
                                "later 0.x (GaussianSplats3D's format)")
    sections, _, _, total = struct.unpack_from("<4I", data, 4)
    level = struct.unpack_from("<H", data, 20)[0]
    sh_min, sh_max = struct.unpack_from("<2f", data, 36)
    sh_min, sh_max = sh_min or -SH_RANGE, sh_max or SH_RANGE
    if level > 2:
        raise KsplatFormatError(f"{name} has compression level {level}; .ksplat files have levels 0, 1 and 2")
    check_count(total, name)
    if HEADER_BYTES + SECTION_BYTES * sections > len(data):
        raise KsplatFormatError(f"{name} is truncated: {sections} section headers run past its {len(data)} bytes")
    base = HEADER_BYTES + SECTION_BYTES * sections
    parts: list[dict[str, np.ndarray]] = []
    degrees = []
    for index in range(sections):
        at = HEADER_BYTES + SECTION_BYTES * index
        count, capacity, bucket_capacity, buckets = struct.unpack_from("<4I", data, at)
        block = struct.unpack_from("<f", data, at + 16)[0]
        record = struct.unpack_from("<H", data, at + 20)[0]
        quant = struct.unpack_from("<I", data, at + 24)[0] or (1 if level == 0 else QUANT_RANGE)
        full, partial = struct.unpack_from("<2I", data, at + 32)
        degree = struct.unpack_from("<H", data, at + 40)[0]
        if degree not in SH_COMPONENTS:
            raise KsplatFormatError(f"{name}: section {index} has SH degree {degree}; .ksplat holds degrees 0 to 2 (3)")
        dtype = _record_dtype(level, degree)
        bucket_bytes = record * buckets + 4 * partial
        end = base + bucket_bytes + dtype.itemsize * capacity
        if end > len(data) or count > capacity:
            raise KsplatFormatError(f"{name} is truncated or corrupt: section {index} ({count} Gaussians) runs past the end "
                                    f"of the file ({len(data)} bytes)")
        records = np.frombuffer(data, dtype=dtype, count=count, offset=base + bucket_bytes)
        positions = records["position"].astype(np.float64)
        if level > 0:
            sizes = np.frombuffer(data, dtype="<u4", count=partial, offset=base).astype(np.int64)
            filled = full * bucket_capacity + int(sizes.sum())
            if record < BUCKET_RECORD or full + partial > buckets or filled > capacity + bucket_capacity:
                raise KsplatFormatError(f"{name} is corrupt: section {index}'s bucket table ({full} full of "
                                        f"{bucket_capacity}, {partial} partly filled, of {buckets}) does not fit its "
                                        f"{capacity} Gaussians")
            centers = np.frombuffer(data, dtype="<f4", count=3 * buckets, offset=base + 4 * partial).reshape(buckets, 3)
            bucket_of = np.concatenate([np.repeat(np.arange(full), bucket_capacity),
                                        np.repeat(np.arange(full, full + partial), sizes)])
            if len(bucket_of) < count or (len(bucket_of) and bucket_of[:count].max(initial=0) >= buckets):
                raise KsplatFormatError(f"{name} is corrupt: section {index}'s buckets hold {len(bucket_of)} Gaussians of "
                                        f"its {count}")
            positions = (positions - quant) * (block / 2.0 / quant) + centers[bucket_of[:count]]
        parts.append({"records": records, "positions": positions})
        degrees.append(degree)
        base = end
    if sum(len(p["positions"]) for p in parts) != total:
        raise KsplatFormatError(f"{name} is corrupt: its sections hold {sum(len(p['positions']) for p in parts)} Gaussians, "
                                f"its header says {total}")
    degree = max(degrees, default=0)
    k = (degree + 1) ** 2 - 1
    out: dict[str, list[np.ndarray]] = {key: [] for key in ("means", "scales", "quats", "rgba", "shN")}
    for part, section_degree in zip(parts, degrees):
        records = part["records"]
        n = len(records)
        sh = np.zeros((n, k * 3))
        if section_degree:
            values = records["sh"].astype(np.float64)
            if level == 2:
                values = sh_min + values / 255.0 * (sh_max - sh_min)
            sh[:, _sh_order(section_degree)] = values
        out["means"].append(part["positions"])
        out["scales"].append(records["scale"].astype(np.float64))
        out["quats"].append(records["rotation"].astype(np.float64))
        out["rgba"].append(records["rgba"].astype(np.float64) / 255.0)
        out["shN"].append(sh.reshape(n, k, 3))
    means, scales, quats, rgba, shN = (np.concatenate(out[key]) for key in ("means", "scales", "quats", "rgba", "shN"))
    alpha = np.clip(rgba[:, 3], 1e-6, 1.0 - 1e-6)
    f = np.float32
    return finite_gaussians({
        "means": torch.from_numpy(means.astype(f)),
        "log_scales": torch.from_numpy(np.log(np.maximum(scales, 1e-12)).astype(f)),
        "quats": torch.from_numpy(quats.astype(f)),
        "opacity_logits": torch.from_numpy(np.log(alpha / (1.0 - alpha)).astype(f)),
        "sh0": torch.from_numpy(((rgba[:, None, :3] - 0.5) / Y0).astype(f)),
        "shN": torch.from_numpy(shN.astype(f)),
    }, name)


def encode_ksplat(params: dict[str, Tensor], level: int = 1) -> bytes:
    """The .ksplat bytes (compression ``level`` 0: float32; 1: 16-bit positions in buckets and float16; 2: as 1 with
    8-bit SH) of pre-activation Gaussian parameters in lift3d's world; SH bands above 2 are dropped (GaussianSplats3D
    reads none)."""
    if level not in (0, 1, 2):
        raise KsplatFormatError(f"a .ksplat compression level is 0, 1 or 2, not {level!r}")
    p = {k: v.detach().double().cpu().numpy() for k, v in params.items()}
    n = len(p["means"])
    if n == 0:
        raise KsplatFormatError("there are no Gaussians to write")
    degree = degree_of(p["shN"].shape[1] + 1)
    if degree > WRITABLE_DEGREE:
        log.warning(".ksplat holds SH bands up to %d: band %d is left out", WRITABLE_DEGREE, degree)
        degree = WRITABLE_DEGREE
    k = (degree + 1) ** 2 - 1
    means = p["means"]
    order = np.arange(n)
    buckets: list[tuple[np.ndarray, np.ndarray]] = []  # (members, center)
    if level > 0:  # Gaussians grouped by block of the grid, each block's in buckets of at most BUCKET_CAPACITY
        cells = np.floor(means / BLOCK_SIZE).astype(np.int64)
        _, inverse = np.unique(cells, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        order = np.argsort(inverse, kind="stable")
        starts = np.flatnonzero(np.diff(inverse[order], prepend=-1))
        for start, stop in zip(starts, list(starts[1:]) + [n]):
            members = order[start:stop]
            center = (cells[members[0]] + 0.5) * BLOCK_SIZE
            buckets += [(members[i: i + BUCKET_CAPACITY], center) for i in range(0, len(members), BUCKET_CAPACITY)]
        buckets.sort(key=lambda bucket: len(bucket[0]) < BUCKET_CAPACITY)  # full ones first, stable otherwise
        order = np.concatenate([members for members, _ in buckets])
    dtype = _record_dtype(level, degree)
    records = np.zeros(n, dtype=dtype)
    if level == 0:
        records["position"] = means[order]
    else:
        centers = np.concatenate([np.repeat(center[None], len(members), 0) for members, center in buckets])
        q = np.round((means[order] - centers) / (BLOCK_SIZE / 2.0 / QUANT_RANGE)) + QUANT_RANGE
        records["position"] = np.clip(q, 0, 2 * QUANT_RANGE)
    quats = p["quats"][order]
    records["scale"] = np.exp(p["log_scales"][order])
    records["rotation"] = quats / np.maximum(np.linalg.norm(quats, axis=1, keepdims=True), 1e-30)
    rgb = np.clip(0.5 + Y0 * p["sh0"][order].reshape(n, 3), 0.0, 1.0)
    alpha = 1.0 / (1.0 + np.exp(-p["opacity_logits"][order]))
    records["rgba"] = np.round(np.concatenate([rgb, alpha[:, None]], axis=1) * 255.0).astype(np.uint8)
    sh_min, sh_max = -SH_RANGE, SH_RANGE
    if degree:
        sh = p["shN"][order][:, :k].reshape(n, k * 3)[:, _sh_order(degree)]
        if level == 2:
            sh_min, sh_max = float(min(sh.min(), -1e-6)), float(max(sh.max(), 1e-6))
            sh = np.round((sh - sh_min) / (sh_max - sh_min) * 255.0)
        records["sh"] = sh
    header = bytearray(HEADER_BYTES)
    header[0:2] = bytes([0, 1])
    struct.pack_into("<4I", header, 4, 1, 1, n, n)
    struct.pack_into("<H", header, 20, level)
    struct.pack_into("<2f", header, 36, sh_min, sh_max)
    full = sum(len(members) == BUCKET_CAPACITY for members, _ in buckets)
    partial_sizes = np.array([len(members) for members, _ in buckets[full:]], dtype="<u4")
    bucket_data = partial_sizes.tobytes() + np.array([center for _, center in buckets], dtype="<f4").tobytes()
    section = bytearray(SECTION_BYTES)
    struct.pack_into("<4I", section, 0, n, n, BUCKET_CAPACITY if level else 0, len(buckets))
    struct.pack_into("<f", section, 16, BLOCK_SIZE if level else 0.0)
    struct.pack_into("<H", section, 20, BUCKET_RECORD if level else 0)
    struct.pack_into("<2I", section, 24, QUANT_RANGE if level else 0, len(bucket_data) + records.nbytes)
    struct.pack_into("<2I", section, 32, full, len(partial_sizes))
    struct.pack_into("<H", section, 40, degree)
    return bytes(header) + bytes(section) + bucket_data + records.tobytes()


def save_ksplat(path: str | Path, params: dict[str, Tensor], keep: Tensor | None = None, sh_degree: int | None = None,
                level: int = 1) -> Path:
    """Write pre-activation parameters as a .ksplat file, atomically; ``keep`` [N] (bool) selects Gaussians,
    ``sh_degree`` cuts the SH bands (the file keeps up to 2)."""
    return write_file(path, encode_ksplat(pruned(params, keep, sh_degree), level))


def load_ksplat(path: str | Path) -> dict[str, Tensor]:
    """Pre-activation parameters of a .ksplat file, in lift3d's world (the .ply's coordinates)."""
    return decode_ksplat(read_file(path, ".ksplat file"), str(path))


register_codec(".ksplat", load_ksplat, save_ksplat, "GaussianSplats3D's .ksplat")

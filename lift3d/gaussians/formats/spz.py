"""Niantic's SPZ Gaussian files (github.com/nianticlabs/spz): version 4 written by default, version 3 on request,
versions 2 to 4 read.

Every version stores the same per-attribute arrays (N Gaussians, K = 0, 3, 8, 15 or 24 SH coefficients for
degree 0..4):

    positions  N x 3 signed 24-bit fixed point: value * 2^fractional_bits (12 here: 1/4096 steps)
    alphas     N x u8: round(255 * sigmoid(opacity logit))
    colors    N x 3 u8: round(255 * (0.15 * sh_dc + 0.5))  (the DC coefficient, not the color)
    scales     N x 3 u8: round(16 * (log scale + 10))
    rotations  N x u32: "smallest three" of the unit xyzw quaternion with its largest component made
               positive: bits 30-31 the largest's index, then 10 bits per other component (in x, y, z, w
               order, first one highest): a sign bit and round(511 * |c| / sqrt(1/2)).  (Version 2:
               N x 3 u8 of x, y, z: round(127.5 * c + 127.5) with w >= 0.)
    SH         N x K x 3 u8 (per Gaussian, coefficient-major, RGB inner): round(128 * c) + 128 snapped to
               steps of 8 (degree-1 coefficients, 5 bits) or 16 (the rest, 4 bits)

Versions 2 and 3: one gzip stream holding a 16-byte header (magic 0x5053474e "NGSP" u32, version u32, count u32,
SH degree u8, fractional bits u8, flags u8, reserved u8) and the arrays back to back.  Version 4: a plain 32-byte
header (magic, version, count u32; SH degree, fractional bits, flags, stream count u8; the table-of-contents
offset u32; 12 reserved bytes), extension records (u32 type, u32 byte length, payload) up to that offset when
flag 0x2 is set, a table of contents (compressed and uncompressed size, u64 each, per stream), then each
non-empty array above as its own ZSTD frame, in that order.  Flag 0x1: trained antialiased (Mip-Splatting's
2D filter), kept by lift3d's readers and writers.

Axes: SPZ stores right-up-back coordinates; 3DGS .ply files (and lift3d's own .ply / .splat, which
hold lift3d's world as is) are read as right-down-front, so positions, rotations and SH are turned
180 degrees about x on the way in and back on the way out, as Niantic's and PlayCanvas's converters
do: `splat-transform x.spz x.ply` gives back lift3d's .ply coordinates.
"""

from __future__ import annotations

import gzip
import logging
import math
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lift3d.gaussians.formats.codec import (
    PlyFormatError,
    check_count,
    finite_gaussians,
    inflate_gzip,
    read_file,
    register_codec,
    write_file,
)
from lift3d.gaussians.formats.ply import pruned
from lift3d.gaussians.transform import FLIP_YZ, rotate_gaussians
from lift3d.sh import MAX_DEGREE, degree_of

log = logging.getLogger(__name__)

MAGIC = 0x5053474E
VERSION = 4  # what lift3d writes unless asked for 3 (system.export.spz_version)
WRITABLE_VERSIONS = (3, 4)
HEADER = struct.Struct("<IIIBBBB")  # versions 2 and 3, inside the gzip stream
HEADER_V4 = struct.Struct("<IIIBBBBI12x")  # version 4, plain
TOC_ENTRY = struct.Struct("<QQ")
FRACTIONAL_BITS = 12
COLOR_SCALE = 0.15
SH_DIMS = {0: 0, 1: 3, 2: 8, 3: 15, 4: 24}
SQRT1_2 = math.sqrt(0.5)
FLAG_ANTIALIASED, FLAG_EXTENSIONS = 0x1, 0x2
ZSTD_LEVEL = 12  # Niantic's own level: ~the size of level 19 at a fraction of the time
COORDINATE_SYSTEM_EXTENSION = 0xADBE0003  # Adobe's record naming the axes the arrays are stored in (u32 code)
# Adobe's axis codes (Niantic's CoordinateSystem enum): 0 unspecified (right-up-back), then three letters, one
# per stored axis x, y, z: L/R, U/D, F/B for 1..8 and L/R, F/B, U/D for 9..16
AXIS_CODES = ["", "LDB", "RDB", "LUB", "RUB", "LDF", "RDF", "LUF", "RUF",
              "LFD", "RFD", "LFU", "RFU", "LBD", "RBD", "LBU", "RBU"]


class SpzFormatError(PlyFormatError):
    """A file that is not a readable SPZ; the message says what is wrong."""


@dataclass(frozen=True)
class SpzInfo:
    """What an SPZ header says beyond the Gaussians: kept through conversions that can carry it."""

    version: int
    count: int
    sh_degree: int  # as stored (0..4; lift3d keeps up to 3)
    antialiased: bool


def _zstd():
    """The ``zstandard`` module (a core dependency); an old environment without it gets the install command."""
    try:
        import zstandard
    except ImportError:
        raise SpzFormatError("SPZ version 4 needs the zstandard package: pip install 'zstandard>=0.22,<1' (or write "
                             "version 3 with system.export.spz_version=3)") from None
    return zstandard


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
    """[N] uint32 smallest-three codes (versions 3 and 4) of quaternions [N, 4] in wxyz order."""
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


def _arrays(params: dict[str, Tensor]) -> tuple[int, int, list[np.ndarray]]:
    """(SH degree, fractional bits, the six attribute arrays) of lift3d parameters, in SPZ's axes."""
    degree = degree_of(params["shN"].shape[1] + 1)
    p = rotate_gaussians({k: v.detach().float().cpu() for k, v in params.items()}, FLIP_YZ)
    n = len(p["means"])
    means = p["means"].numpy().astype(np.float64)
    bits = _fractional_bits(means)
    fixed = np.round(means * (1 << bits)).astype(np.int32).reshape(-1)
    positions = np.stack([fixed & 0xFF, (fixed >> 8) & 0xFF, (fixed >> 16) & 0xFF], axis=1).astype(np.uint8)
    alphas = _u8(255.0 / (1.0 + np.exp(-p["opacity_logits"].numpy().astype(np.float64))))
    colors = _u8(p["sh0"].reshape(n, 3).numpy() * (COLOR_SCALE * 255.0) + 127.5)
    scales = _u8((p["log_scales"].numpy() + 10.0) * 16.0)
    rotations = pack_rotations(p["quats"].numpy()).astype("<u4")
    sh = p["shN"].numpy()  # [N, K, 3]: coefficient-major with RGB inner, as SPZ stores them
    sh_bytes = np.concatenate([quantize_sh(sh[:, :3], 8), quantize_sh(sh[:, 3:], 16)], axis=1) if degree else sh.astype(np.uint8)
    return degree, bits, [positions, alphas, colors, scales, rotations, sh_bytes]


def encode_spz(params: dict[str, Tensor], antialiased: bool = False, version: int = VERSION) -> bytes:
    """The SPZ bytes (``version`` 4: ZSTD streams; 3: one gzip stream) of pre-activation Gaussian parameters in
    lift3d's world; ``antialiased`` sets the header's flag for Gaussians trained with the 2D filter."""
    if version not in WRITABLE_VERSIONS:
        raise SpzFormatError(f"lift3d writes SPZ versions 3 and 4, not {version!r}: system.export.spz_version=4 (or 3 "
                             "for readers that predate version 4)")
    n = len(params["means"])
    if n == 0:
        raise SpzFormatError("there are no Gaussians to write (SPZ readers refuse a file of 0 points)")
    degree, bits, arrays = _arrays(params)
    flags = FLAG_ANTIALIASED if antialiased else 0
    if version == 3:
        header = HEADER.pack(MAGIC, 3, n, degree, bits, flags, 0)
        return gzip.compress(header + b"".join(a.tobytes() for a in arrays), compresslevel=9, mtime=0)
    compressor = _zstd().ZstdCompressor(level=ZSTD_LEVEL)
    raw = [a.tobytes() for a in arrays if a.size]
    frames = [compressor.compress(r) for r in raw]
    header = HEADER_V4.pack(MAGIC, 4, n, degree, bits, flags, len(frames), HEADER_V4.size)
    toc = b"".join(TOC_ENTRY.pack(len(f), len(r)) for f, r in zip(frames, raw))
    return header + toc + b"".join(frames)


def save_spz(path: str | Path, params: dict[str, Tensor], keep: Tensor | None = None, sh_degree: int | None = None,
             version: int = VERSION, antialiased: bool = False) -> Path:
    """Write pre-activation parameters as an .spz file (``version`` 4 or 3), atomically; ``keep`` [N] (bool) selects
    Gaussians, ``sh_degree`` cuts the SH bands (the file keeps the rest, up to degree 3)."""
    return write_file(path, encode_spz(pruned(params, keep, sh_degree), antialiased=antialiased, version=version))


def _axes_to_rub(code: int, name: str) -> np.ndarray | None:
    """The rotation from the axes of Adobe's coordinate-system record to right-up-back (None: already RUB)."""
    if code in (0, 4):
        return None
    if not 0 < code < len(AXIS_CODES):
        raise SpzFormatError(f"{name} names an unknown coordinate system ({code}) in its SPZ_ADOBE_coordinate_system "
                             "record: convert it to right-up-back with the tool that wrote it")
    letters = AXIS_CODES[code]
    # the direction, in RUB, that each stored axis points to
    direction = {"R": (1, 0, 0), "L": (-1, 0, 0), "U": (0, 1, 0), "D": (0, -1, 0), "B": (0, 0, 1), "F": (0, 0, -1)}
    matrix = np.array([direction[c] for c in letters], dtype=np.float64).T
    if np.linalg.det(matrix) < 0:
        raise SpzFormatError(f"{name} stores its Gaussians in mirrored axes ({letters}, SPZ_ADOBE_coordinate_system), "
                             "which lift3d does not read: convert it to right-up-back with the tool that wrote it")
    return matrix


def _extensions(data: bytes, end: int, name: str) -> np.ndarray | None:
    """Walk version 4's extension records; the axis change of a coordinate-system record, others skipped."""
    offset, rotation = HEADER_V4.size, None
    while offset + 8 <= end:
        kind, length = struct.unpack_from("<II", data, offset)
        payload = data[offset + 8: offset + 8 + length]
        if len(payload) != length or offset + 8 + length > end:
            raise SpzFormatError(f"{name} is corrupt: an extension record runs past the table of contents")
        if kind == COORDINATE_SYSTEM_EXTENSION and length >= 4:
            rotation = _axes_to_rub(struct.unpack_from("<I", payload)[0], name)
        else:
            log.warning("%s: skipped SPZ extension record %#x (%d bytes), which lift3d does not read", name, kind, length)
        offset += 8 + length
    return rotation


def _v4_body(data: bytes, name: str) -> tuple[tuple, bytes, np.ndarray | None]:
    """(header fields, the streams concatenated, the axis change of an extension) of version-4 bytes."""
    if len(data) < HEADER_V4.size:
        raise SpzFormatError(f"{name} is too short for an SPZ version 4 header ({len(data)} bytes)")
    magic, version, n, degree, bits, flags, streams, toc = HEADER_V4.unpack_from(data)
    if version != 4:
        raise SpzFormatError(f"{name} is SPZ version {version} with a plain header; lift3d reads versions 2 to 4 "
                             "(a newer file: convert it with `splat-transform --spz-version 4 IN.spz OUT.spz`)")
    if not HEADER_V4.size <= toc <= len(data) - TOC_ENTRY.size * streams:
        raise SpzFormatError(f"{name} is truncated or corrupt: its table of contents (at byte {toc}, {streams} streams) "
                             f"lies outside the file's {len(data)} bytes")
    check_count(n, name)
    expected = [size for size in _array_sizes(n, degree, version, name) if size]
    rotation = _extensions(data, toc, name) if flags & FLAG_EXTENSIONS else None
    offset, parts = toc + TOC_ENTRY.size * streams, []
    decompressor = _zstd().ZstdDecompressor()
    for i in range(streams):
        packed, size = TOC_ENTRY.unpack_from(data, toc + TOC_ENTRY.size * i)
        if i >= len(expected) or size != expected[i]:  # checked before inflating: the table may claim anything
            implied = f"{expected[i]:,}" if i < len(expected) else "none"
            raise SpzFormatError(f"{name} is truncated or corrupt: its table of contents gives stream {i} {size:,} bytes, "
                                 f"expected {implied} for {n:,} Gaussians of SH degree {degree}")
        frame = data[offset: offset + packed]
        if len(frame) != packed:
            raise SpzFormatError(f"{name} is truncated: stream {i} ({packed} bytes) runs past the end of the file")
        try:
            part = decompressor.decompress(frame, max_output_size=size)
        except Exception as error:  # zstandard.ZstdError, or a frame without its content size
            raise SpzFormatError(f"{name} is corrupt: stream {i} is not a ZSTD frame of {size} bytes ({error})") from None
        if len(part) != size:
            raise SpzFormatError(f"{name} is corrupt: stream {i} holds {len(part)} bytes, its table says {size}")
        parts.append(part)
        offset += packed
    return (magic, version, n, degree, bits, flags), b"".join(parts), rotation


def _legacy_body(data: bytes, name: str) -> tuple[tuple, bytes]:
    """(header fields, the arrays) of a version 2 or 3 file (one gzip stream)."""
    try:  # the header first: its count bounds how far the stream may inflate
        raw = zlib.decompressobj(wbits=31).decompress(data, HEADER.size)
    except zlib.error as error:
        raise SpzFormatError(f"{name} is not an SPZ file (not a complete gzip stream, as versions 2 and 3 "
                             f"are, nor version 4's plain 'NGSP' header: {error})") from None
    if len(raw) < HEADER.size:
        raise SpzFormatError(f"{name} is too short for an SPZ header ({len(raw)} bytes)")
    magic, version, n, degree, bits, flags, _ = HEADER.unpack_from(raw)
    if magic != MAGIC:
        raise SpzFormatError(f"{name} is not an SPZ file: magic {magic:#x}, expected {MAGIC:#x} ('NGSP')")
    if version not in (2, 3):
        raise SpzFormatError(f"{name} is SPZ version {version} inside gzip; lift3d reads versions 2 to 4")
    if flags & FLAG_EXTENSIONS:
        raise SpzFormatError(f"{name} carries SPZ extensions inside its gzip stream, which lift3d does not read: "
                             "convert it with `splat-transform --spz-version 4 IN.spz OUT.spz`")
    check_count(n, name)
    try:
        raw = inflate_gzip(data, HEADER.size + sum(_array_sizes(n, degree, version, name)), name)
    except PlyFormatError as error:
        raise SpzFormatError(str(error)) from None
    return (magic, version, n, degree, bits, flags), raw[HEADER.size:]


def _array_sizes(n: int, degree: int, version: int, name: str) -> list[int]:
    """The byte size of each of the six arrays of ``n`` Gaussians of SH ``degree`` (rotations: 4 bytes from version 3)."""
    if degree not in SH_DIMS:
        raise SpzFormatError(f"{name} has SH degree {degree}; SPZ allows 0..4")
    return [9 * n, n, 3 * n, 3 * n, (4 if version >= 3 else 3) * n, 3 * SH_DIMS[degree] * n]


def read_spz(data: bytes, name: str = "the data") -> tuple[dict[str, Tensor], SpzInfo]:
    """Pre-activation parameters (lift3d's world) and the header facts of SPZ bytes (versions 2 to 4)."""
    rotation = None
    if data[:4] == b"NGSP":
        (_, version, n, degree, bits, flags), body, rotation = _v4_body(data, name)
    else:
        (_, version, n, degree, bits, flags), body = _legacy_body(data, name)
    k, sizes = SH_DIMS.get(degree, 0), _array_sizes(n, degree, version, name)
    if len(body) != sum(sizes):
        raise SpzFormatError(f"{name} is truncated or corrupt: {len(body)} data bytes for {n} Gaussians "
                             f"of SH degree {degree}, expected {sum(sizes)}")
    arrays, offset = [], 0
    for size in sizes:
        arrays.append(np.frombuffer(body, dtype=np.uint8, count=size, offset=offset))
        offset += size
    positions, alphas, colors, scales, rotations, sh = arrays
    b = positions.reshape(-1, 3).astype(np.int32)
    fixed = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
    fixed = np.where(fixed & 0x800000, fixed - (1 << 24), fixed)
    if version >= 3:
        quats = unpack_rotations(rotations.view("<u4"))
    else:
        xyz = rotations.reshape(n, 3).astype(np.float64) / 127.5 - 1.0
        quats = np.concatenate([np.sqrt(np.maximum(0.0, 1.0 - (xyz * xyz).sum(1)))[:, None], xyz], axis=1)
        quats /= np.maximum(np.linalg.norm(quats, axis=1, keepdims=True), 1e-30)  # rounded x, y, z can reach |xyz| > 1
    kept = SH_DIMS[min(degree, MAX_DEGREE)]
    if kept < k:
        log.warning("%s has SH degree %d; lift3d keeps bands up to %d (the view-dependent detail of band 4 is dropped)",
                    name, degree, MAX_DEGREE)
    f = np.float32
    params = {
        "means": torch.from_numpy((fixed.reshape(n, 3) / float(1 << bits)).astype(f)),
        "log_scales": torch.from_numpy((scales.reshape(n, 3) / 16.0 - 10.0).astype(f)),
        "quats": torch.from_numpy(quats.astype(f)),
        "opacity_logits": torch.from_numpy(_logit(alphas / 255.0).astype(f)),
        "sh0": torch.from_numpy(((colors.reshape(n, 1, 3) / 255.0 - 0.5) / COLOR_SCALE).astype(f)),
        "shN": torch.from_numpy(((sh.reshape(n, k, 3)[:, :kept].astype(np.float64) - 128.0) / 128.0).astype(f)),
    }
    if rotation is not None:  # stored in other axes (Adobe's record): to right-up-back first
        params = rotate_gaussians(params, torch.from_numpy(rotation))
    info = SpzInfo(version=version, count=n, sh_degree=degree, antialiased=bool(flags & FLAG_ANTIALIASED))
    return finite_gaussians(rotate_gaussians(params, torch.tensor(FLIP_YZ).T), name), info


def decode_spz(data: bytes, name: str = "the data") -> dict[str, Tensor]:
    """Pre-activation parameters (lift3d's world) of SPZ bytes (versions 2 to 4)."""
    return read_spz(data, name)[0]


def spz_info(path: str | Path) -> SpzInfo:
    """The header facts of an .spz file (version, count, SH degree, the antialiased flag), from its header alone."""
    with open(path, "rb") as handle:
        head = handle.read(HEADER_V4.size)
        if head[:4] == b"NGSP":
            if len(head) < HEADER_V4.size:
                raise SpzFormatError(f"{path} is too short for an SPZ version 4 header ({len(head)} bytes)")
            _, version, n, degree, _, flags, _, _ = HEADER_V4.unpack_from(head)
        else:
            handle.seek(0)
            try:
                with gzip.open(handle) as stream:
                    raw = stream.read(HEADER.size)
            except (OSError, EOFError, zlib.error) as error:
                raise SpzFormatError(f"{path} is not an SPZ file (not a complete gzip stream, as versions 2 and 3 are, "
                                     f"nor version 4's plain 'NGSP' header: {error})") from None
            if len(raw) < HEADER.size or HEADER.unpack_from(raw)[0] != MAGIC:
                raise SpzFormatError(f"{path} is not an SPZ file: no 'NGSP' header in its gzip stream")
            _, version, n, degree, _, flags, _ = HEADER.unpack_from(raw)
    return SpzInfo(version=version, count=n, sh_degree=degree, antialiased=bool(flags & FLAG_ANTIALIASED))


def load_spz(path: str | Path) -> dict[str, Tensor]:
    """Pre-activation parameters of an .spz file, in lift3d's world (see the module docstring for the axes)."""
    return decode_spz(read_file(path, "SPZ file"), str(path))


register_codec(".spz", load_spz, save_spz, "Niantic's compressed .spz")

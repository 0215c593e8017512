"""PlayCanvas's SOG Gaussian files (meta.json version 2 + lossless WebP images, bundled as a .sog zip).

Every per-Gaussian image is W x H RGBA, W = 4 ceil(sqrt(N) / 4), H = 4 ceil(N / W / 4), Gaussian i at
pixel i in row-major order (the writer orders the Gaussians along a Morton curve of their positions so
neighbors share pixels and the WebP coder finds the redundancy):

    means_l / means_u  n = sign(x) ln(|x| + 1) per axis, as 16 bits between meta.means.mins and .maxs:
                       low byte in means_l, high byte in means_u (RGB = x, y, z)
    quats              the unit wxyz quaternion with its largest component made positive: the other three
                       times sqrt(2) as bytes round(255 (c / 2 + 0.5)) in RGB, A = 252 + the largest's index
    scales             RGB: indices into meta.scales.codebook (256 log scales, a 1-D k-means of all three axes)
    sh0                RGB: indices into meta.sh0.codebook (256 DC coefficients); A: round(255 sigmoid(opacity))
    shN_labels         RG: a 16-bit index into the palette of meta.shN.count SH vectors (a k-means of the
                       Gaussians' higher bands), for SH degree meta.shN.bands
    shN_centroids      64 palette entries a row, K = 3, 8, 15 pixels each (coefficient j of entry e at
                       x = (e % 64) K + j, y = e // 64); RGB: indices into meta.shN.codebook (256 values)

Axes: SOG holds the .ply's coordinates (splat-transform reads it into the same space as a .ply), so
lift3d's world goes in as is, as in lift3d's .ply and .splat.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
import zlib
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from lift3d.gaussians.formats.codec import PlyFormatError, check_count, finite_gaussians, read_file, register_codec, write_file
from lift3d.gaussians.formats.ply import pruned
from lift3d.imaging import open_image
from lift3d.limits import TEXTURE_PIXELS
from lift3d.sh import degree_of

SH_COEFFS = {0: 0, 1: 3, 2: 8, 3: 15}
FILES = ("means_l.webp", "means_u.webp", "quats.webp", "scales.webp", "sh0.webp")
META_BYTES = 64 * 2**20  # a meta.json larger than this (its codebooks are a few KB) is not a SOG's


class SogFormatError(PlyFormatError):
    """A file that is not a readable SOG; the message says what is wrong."""


# --------------------------------------------------------------------------------------------- quantizers


def kmeans_1d(values: np.ndarray, k: int = 256, iterations: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """(codebook [<=k] ascending float32, labels [M] uint8) of a 1-D k-means: each value's label is its
    nearest codebook entry. Starts from quantiles, then Lloyd steps on the sorted values."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    centers = np.unique(np.quantile(v, (np.arange(k) + 0.5) / k))
    for _ in range(iterations):
        labels = np.searchsorted((centers[:-1] + centers[1:]) / 2, v)
        counts = np.bincount(labels, minlength=len(centers))
        sums = np.bincount(labels, weights=v, minlength=len(centers))
        moved = np.where(counts > 0, sums / np.maximum(counts, 1), centers)
        moved = np.unique(moved)
        if len(moved) == len(centers) and np.allclose(moved, centers, rtol=0, atol=0):
            break
        centers = moved
    codebook = centers.astype(np.float32)
    labels = nearest_1d(codebook, v)
    return codebook, labels.astype(np.uint8)


def nearest_1d(codebook: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Index of the nearest entry of an ascending ``codebook`` for each value."""
    c = codebook.astype(np.float64)
    i = np.clip(np.searchsorted(c, values), 1, max(len(c) - 1, 1))
    if len(c) == 1:
        return np.zeros(len(values), dtype=np.int64)
    left_closer = np.abs(values - c[i - 1]) <= np.abs(c[i] - values)
    return np.where(left_closer, i - 1, i)


def kmeans(points: Tensor, k: int, iterations: int = 10, seed: int = 0, block: int = 1 << 24,
           device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """(centroids [k, D], labels [N]) of Lloyd's k-means on ``points`` [N, D] (float32), started from k
    distinct points chosen with ``seed``; an emptied cluster keeps its centroid. Distances are computed
    ``block`` point-centroid pairs at a time (64 MB), on ``device`` (default: CUDA when there is one, where a
    trained scene's 64k-entry SH palette takes seconds instead of minutes); results come back on the CPU."""
    n = len(points)
    k = min(k, n)
    chunk = max(1, block // k)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    generator = torch.Generator().manual_seed(seed)
    points = points.to(device)
    centroids = points[torch.randperm(n, generator=generator)[:k].to(device)].clone()
    labels = torch.zeros(n, dtype=torch.long, device=device)
    for step in range(iterations + 1):
        c_norm = (centroids * centroids).sum(1)
        for start in range(0, n, chunk):
            block = points[start:start + chunk]
            labels[start:start + chunk] = (c_norm[None] - 2.0 * block @ centroids.T).argmin(dim=1)
        if step == iterations:
            break
        sums = torch.zeros_like(centroids).index_add_(0, labels, points)
        counts = torch.bincount(labels, minlength=k).float()
        filled = counts > 0
        centroids[filled] = sums[filled] / counts[filled, None]
    return centroids.cpu(), labels.cpu()


def palette_size(n: int) -> int:
    """Default SH palette size: the largest power of two <= n / 16, within 256..65536 (16-bit labels) and at
    most n. Each entry costs 3 bytes a coefficient (45 at degree 3) before WebP, so a palette near n, as
    splat-transform's rule (1024 x 2^floor(log2(n / 1024))) gives for a few ten thousand Gaussians, would
    make the palette most of the file."""
    return max(1, min(n, 65536, max(256, 2 ** math.floor(math.log2(max(n, 1) / 16)))))


def morton_order(means: np.ndarray) -> np.ndarray:
    """Indices [N] ordering points along a 3-D Morton (Z-order) curve of their 10-bit quantized positions."""
    lo, hi = means.min(0), means.max(0)
    q = ((means - lo) / np.where(hi > lo, hi - lo, 1.0) * 1023).astype(np.uint64)
    code = np.zeros(len(means), dtype=np.uint64)
    for bit in range(10):
        for axis in range(3):
            code |= ((q[:, axis] >> np.uint64(bit)) & np.uint64(1)) << np.uint64(3 * bit + axis)
    return np.argsort(code, kind="stable")


# --------------------------------------------------------------------------------------------- images


def _webp(rgba: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    # exact: keep the RGB of pixels whose alpha is 0 (sh0's alpha is the opacity, and 0 is a valid one)
    Image.fromarray(rgba, "RGBA").save(buffer, "WEBP", lossless=True, quality=100, method=4, exact=True)
    return buffer.getvalue()


def _image(columns: list[np.ndarray], width: int, height: int, alpha: np.ndarray | int = 255) -> np.ndarray:
    """An RGBA image [H, W, 4] uint8 with pixel i = (columns[0][i], columns[1][i], columns[2][i], alpha[i])."""
    flat = np.zeros((width * height, 4), dtype=np.uint8)
    n = len(columns[0])
    for c, column in enumerate(columns):
        flat[:n, c] = column
    flat[:n, 3] = alpha
    return flat.reshape(height, width, 4)


def _log_transform(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


def _inverse_log_transform(n: np.ndarray) -> np.ndarray:
    return np.sign(n) * np.expm1(np.abs(n))


def encode_sog(params: dict[str, Tensor], sort: bool = True, sh_palette: int = 0, kmeans_iterations: int = 10) -> bytes:
    """The .sog bundle (a zip of meta.json and the WebP images) of pre-activation Gaussian parameters.
    ``sort``: Morton order (smaller files; the Gaussians come back reordered); ``sh_palette``: SH palette
    entries (0: ``palette_size(N)``)."""
    from lift3d.aftercare import require_webp

    require_webp()
    p = {k: v.detach().float().cpu().numpy() for k, v in params.items()}
    n = len(p["means"])
    if n == 0:
        raise SogFormatError("there are no Gaussians to write")
    degree = degree_of(p["shN"].shape[1] + 1)
    if sort:
        p = {k: v[morton_order(p["means"])] for k, v in p.items()}
    width = 4 * math.ceil(math.sqrt(n) / 4)
    height = 4 * math.ceil(n / width / 4)
    images: dict[str, np.ndarray] = {}

    logged = _log_transform(p["means"].astype(np.float64))
    mins, maxs = logged.min(0), logged.max(0)
    span = np.where(maxs > mins, maxs - mins, 1.0)
    q16 = np.clip(np.round(65535.0 * (logged - mins) / span), 0, 65535).astype(np.uint16)
    images["means_l.webp"] = _image([q16[:, a] & 0xFF for a in range(3)], width, height)
    images["means_u.webp"] = _image([q16[:, a] >> 8 for a in range(3)], width, height)

    q = p["quats"].astype(np.float64)
    q /= np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-30)
    largest = np.abs(q).argmax(axis=1)
    q *= np.where(q[np.arange(n), largest] < 0, -1.0, 1.0)[:, None]
    others = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])[largest]
    small = np.take_along_axis(q, others, axis=1) * math.sqrt(2.0)
    quat_bytes = np.clip(np.round(255.0 * (small * 0.5 + 0.5)), 0, 255).astype(np.uint8)
    images["quats.webp"] = _image([quat_bytes[:, i] for i in range(3)], width, height, (252 + largest).astype(np.uint8))

    scale_codebook, scale_labels = kmeans_1d(p["log_scales"])
    scale_labels = scale_labels.reshape(n, 3)
    images["scales.webp"] = _image([scale_labels[:, i] for i in range(3)], width, height)

    dc_codebook, dc_labels = kmeans_1d(p["sh0"].reshape(n, 3))
    dc_labels = dc_labels.reshape(n, 3)
    alpha = np.clip(np.round(255.0 / (1.0 + np.exp(-p["opacity_logits"].astype(np.float64)))), 0, 255).astype(np.uint8)
    images["sh0.webp"] = _image([dc_labels[:, i] for i in range(3)], width, height, alpha)

    meta = {
        "version": 2, "asset": {"generator": "lift3d"}, "count": n,
        "means": {"mins": mins.tolist(), "maxs": maxs.tolist(), "files": ["means_l.webp", "means_u.webp"]},
        "scales": {"codebook": scale_codebook.tolist(), "files": ["scales.webp"]},
        "quats": {"files": ["quats.webp"]},
        "sh0": {"codebook": dc_codebook.tolist(), "files": ["sh0.webp"]},
    }
    if degree > 0:
        k = SH_COEFFS[degree]
        vectors = torch.from_numpy(np.ascontiguousarray(p["shN"].transpose(0, 2, 1).reshape(n, 3 * k)))  # channel-major
        centroids, labels = kmeans(vectors, sh_palette or palette_size(n), kmeans_iterations)
        count = len(centroids)
        sh_codebook, sh_labels = kmeans_1d(centroids.numpy())
        entries = sh_labels.reshape(count, 3, k).transpose(0, 2, 1)  # [entry, coefficient, channel]
        rows = math.ceil(count / 64)
        grid = np.zeros((rows * 64, k, 4), dtype=np.uint8)
        grid[:count, :, :3] = entries
        grid[:, :, 3] = 255
        images["shN_centroids.webp"] = grid.reshape(rows, 64 * k, 4)
        labels = labels.numpy().astype(np.uint32)
        images["shN_labels.webp"] = _image([labels & 0xFF, labels >> 8], width, height)
        meta["shN"] = {"count": count, "bands": degree, "codebook": sh_codebook.tolist(),
                       "files": ["shN_centroids.webp", "shN_labels.webp"]}
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as bundle:  # WebP is compressed already
        bundle.writestr("meta.json", json.dumps(meta))
        for name, image in images.items():
            bundle.writestr(name, _webp(image))
    return buffer.getvalue()


def save_sog(path: str | Path, params: dict[str, Tensor], keep: Tensor | None = None, sh_degree: int | None = None,
             sort: bool = True, sh_palette: int = 0) -> Path:
    """Write pre-activation parameters as a bundled .sog file, atomically; ``keep`` [N] (bool) selects Gaussians,
    ``sh_degree`` cuts the SH bands."""
    return write_file(path, encode_sog(pruned(params, keep, sh_degree), sort=sort, sh_palette=sh_palette))


# --------------------------------------------------------------------------------------------- reading


def _decode_image(bundle: zipfile.ZipFile, name: str, files: set[str], source: str, min_pixels: int) -> np.ndarray:
    """A bundled WebP as [H * W, 4] uint8, checked to hold at least ``min_pixels`` pixels."""
    if name not in files:
        raise SogFormatError(f"{source} lacks {name}, which its meta.json names")
    fix = "write it again with fewer Gaussians"
    _check_member(bundle, name, 4 * TEXTURE_PIXELS.value + 2**20, source, fix)
    try:
        with open_image(io.BytesIO(bundle.read(name)), f"{source}'s {name}", SogFormatError, TEXTURE_PIXELS, fix) as image:
            if image.width * image.height < min_pixels:
                raise SogFormatError(f"{source}: {name} has {image.width * image.height} pixels, fewer than the "
                                     f"{min_pixels} needed")
            rgba = np.asarray(image.convert("RGBA"))
    except (OSError, SyntaxError, zipfile.BadZipFile, EOFError, zlib.error) as error:
        raise SogFormatError(f"{source}: {name} is not a readable WebP image ({error})") from None
    return rgba.reshape(-1, 4)


def _check_member(bundle: zipfile.ZipFile, name: str, limit: int, source: str, fix: str) -> None:
    """Refuse a bundled file whose directory entry says it unpacks to more than ``limit`` bytes, before it is read
    (zipfile never inflates a member past that size)."""
    size = bundle.getinfo(name).file_size
    if size > limit:
        raise SogFormatError(f"{source}'s {name} unpacks to {size:,} bytes, more than a SOG's {name} needs ({limit:,}): "
                             f"{fix}")


def decode_sog(data: bytes, name: str = "the data") -> dict[str, Tensor]:
    """Pre-activation parameters of a bundled .sog (meta.json version 2), in the file's (= lift3d's) axes."""
    try:
        bundle = zipfile.ZipFile(io.BytesIO(data))
        files = set(bundle.namelist())
        if "meta.json" in files:
            _check_member(bundle, "meta.json", META_BYTES, name, "it is not a SOG bundle")
        meta = json.loads(bundle.read("meta.json")) if "meta.json" in files else None
    except SogFormatError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, zlib.error) as error:
        raise SogFormatError(f"{name} is not a SOG bundle (a zip with meta.json): {error}") from None
    if meta is None:
        raise SogFormatError(f"{name} is a zip without meta.json; a .sog bundle holds meta.json and WebP images")
    if not isinstance(meta, dict) or meta.get("version") != 2:
        version = meta.get("version") if isinstance(meta, dict) else None
        raise SogFormatError(f"{name} has SOG meta version {version!r}; lift3d reads version 2 (splat-transform >= 1.0)")
    try:
        n = int(meta["count"])
        check_count(n, name)
        return finite_gaussians(_decode(bundle, meta, n, files, name), name)
    except PlyFormatError:
        raise
    except (KeyError, TypeError, IndexError, ValueError) as error:
        raise SogFormatError(f"{name}: meta.json lacks or misstates {error} "
                             "(see the SOG layout in lift3d.gaussians.formats.sog)") from None


def _decode(bundle: zipfile.ZipFile, meta: dict, n: int, files: set[str], name: str) -> dict[str, Tensor]:
    def image(key: str, index: int = 0, pixels: int = n) -> np.ndarray:
        return _decode_image(bundle, meta[key]["files"][index], files, name, pixels)[:pixels]

    lo, hi = image("means", 0).astype(np.uint32), image("means", 1).astype(np.uint32)
    q16 = (lo[:, :3] | (hi[:, :3] << 8)).astype(np.float64)
    mins, maxs = np.asarray(meta["means"]["mins"], dtype=np.float64), np.asarray(meta["means"]["maxs"], dtype=np.float64)
    span = np.where(maxs - mins != 0, maxs - mins, 1.0)
    means = _inverse_log_transform(mins + span * q16 / 65535.0)

    quat = image("quats")
    if (quat[:, 3] < 252).any():
        raise SogFormatError(f"{name}: quats.webp has alpha values below 252 (A must be 252 + the largest component's index)")
    largest = quat[:, 3].astype(np.int64) - 252
    others = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])[largest]
    small = (quat[:, :3].astype(np.float64) / 255.0 * 2.0 - 1.0) / math.sqrt(2.0)
    quats = np.zeros((n, 4))
    np.put_along_axis(quats, others, small, axis=1)
    quats[np.arange(n), largest] = np.sqrt(np.maximum(0.0, 1.0 - (small * small).sum(1)))

    scale_codebook = np.asarray(meta["scales"]["codebook"], dtype=np.float32)
    sh0_codebook = np.asarray(meta["sh0"]["codebook"], dtype=np.float32)
    scales, sh0 = image("scales"), image("sh0")
    alpha = np.clip(sh0[:, 3] / 255.0, 1e-6, 1.0 - 1e-6)
    f = np.float32
    params = {
        "means": torch.from_numpy(means.astype(f)),
        "log_scales": torch.from_numpy(scale_codebook[scales[:, :3]]),
        "quats": torch.from_numpy(quats.astype(f)),
        "opacity_logits": torch.from_numpy(np.log(alpha / (1.0 - alpha)).astype(f)),
        "sh0": torch.from_numpy(sh0_codebook[sh0[:, :3]].reshape(n, 1, 3)),
        "shN": torch.zeros(n, 0, 3),
    }
    if meta.get("shN"):
        degree, count = int(meta["shN"]["bands"]), int(meta["shN"]["count"])
        if degree not in (1, 2, 3):
            raise SogFormatError(f"{name}: meta.shN.bands is {degree}; SOG allows 1..3")
        k = SH_COEFFS[degree]
        codebook = np.asarray(meta["shN"]["codebook"], dtype=np.float32)
        centroids = _decode_image(bundle, meta["shN"]["files"][0], files, name, 64 * k * math.ceil(count / 64))
        entries = codebook[centroids[: count * k, :3]].reshape(count, k, 3)
        labels_rgba = image("shN", 1)
        labels = labels_rgba[:, 0].astype(np.int64) | (labels_rgba[:, 1].astype(np.int64) << 8)
        if (labels >= count).any():
            raise SogFormatError(f"{name}: shN_labels.webp points past the {count} palette entries")
        params["shN"] = torch.from_numpy(np.ascontiguousarray(entries[labels]))
    return params


def load_sog(path: str | Path) -> dict[str, Tensor]:
    """Pre-activation parameters of a bundled .sog file (see the module docstring for the layout)."""
    return decode_sog(read_file(path, "SOG file"), str(path))


register_codec(".sog", load_sog, save_sog, "PlayCanvas's bundled .sog")

"""Levels of detail for large scenes: PlayCanvas's streamed SOG (``lod-meta.json`` beside one unbundled SOG per level),
the layout splat-transform writes for ``lod-meta.json`` outputs and PlayCanvas's engine streams by distance.

    <folder>/lod-meta.json   {"version": 1, "asset": {...}, "count": total, "counts": [per level], "lodLevels": L,
                              "filenames": ["0_0/meta.json", "1_0/meta.json", ...], "tree": node}
    <folder>/<l>_0/          level l as an unbundled SOG: meta.json (version 2) and its WebP images
                             (``lift3d.gaussians.formats.sog``), the level's Gaussians grouped by the tree's leaves

A node is ``{"bound": {"min": [x, y, z], "max": [x, y, z]}, "children": [node, node]}`` (the box of its Gaussians'
one-sigma boxes, as splat-transform bounds them) or a leaf
``{"bound": ..., "lods": {"l": {"file": index into filenames, "offset": first Gaussian, "count": n}}}``; the tree
halves space at the median of its longest axis until a leaf holds at most ``chunk_count`` Gaussians of level 0
and spans at most ``chunk_extent`` units (splat-transform's defaults: 512 K and 16), so a viewer loads the
detail of near leaves and the coarse levels of far ones. Level 0 is the Gaussians themselves; each coarser level
merges neighbors along a Morton curve in pairs (about half the Gaussians each level) by moment matching: the
merged mean and covariance are those of the pair's mixture weighted by opacity x volume, the colors and SH
their weighted mean, the opacity 1 - (1 - a)(1 - b). Positions are lift3d's world as is, as in .sog.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lift3d.gaussians.formats.codec import register_codec
from lift3d.gaussians.formats.ply import pruned
from lift3d.gaussians.formats.sog import META_BYTES, SogFormatError, decode_sog, encode_sog, morton_order
from lift3d.limits import GAUSSIAN_FILE_BYTES
from lift3d.rotations import matrix_to_quaternion_np, quaternion_to_matrix_np
from lift3d.saving import atomic_write_bytes

CHUNK_COUNT, CHUNK_EXTENT = 512 * 1024, 16.0  # splat-transform's --lod-chunk-count (K) and --lod-chunk-extent
META = "lod-meta.json"


def merge_pairs(params: dict[str, Tensor]) -> dict[str, Tensor]:
    """One coarser level: Gaussians paired along a Morton curve of their means and each pair merged by moment
    matching (see the module docstring); an odd one out is kept as it is."""
    p = {k: v.detach().double().cpu().numpy() for k, v in params.items()}
    n = len(p["means"])
    order = morton_order(p["means"])
    half = n // 2
    a, b, rest = order[0: 2 * half: 2], order[1: 2 * half: 2], order[2 * half:]
    alpha = 1.0 / (1.0 + np.exp(-p["opacity_logits"]))
    scales = np.exp(p["log_scales"])
    rot = quaternion_to_matrix_np(p["quats"])
    cov = rot @ (scales[:, :, None] ** 2 * np.eye(3)) @ rot.transpose(0, 2, 1)
    weight = alpha * scales.prod(axis=1) + 1e-30
    wa, wb = weight[a] / (weight[a] + weight[b]), weight[b] / (weight[a] + weight[b])
    mean = wa[:, None] * p["means"][a] + wb[:, None] * p["means"][b]
    da, db = p["means"][a] - mean, p["means"][b] - mean
    merged_cov = (wa[:, None, None] * (cov[a] + da[:, :, None] * da[:, None, :])
                  + wb[:, None, None] * (cov[b] + db[:, :, None] * db[:, None, :]))
    values, vectors = np.linalg.eigh(merged_cov)
    vectors[:, :, 0] *= np.where(np.linalg.det(vectors) < 0, -1.0, 1.0)[:, None]  # a rotation, not a reflection
    opacity = np.clip(1.0 - (1.0 - alpha[a]) * (1.0 - alpha[b]), 1e-6, 1.0 - 1e-6)

    def mixed(name: str) -> np.ndarray:
        shape = (-1,) + (1,) * (p[name].ndim - 1)
        return wa.reshape(shape) * p[name][a] + wb.reshape(shape) * p[name][b]

    merged = {
        "means": mean, "log_scales": 0.5 * np.log(np.maximum(values, 1e-30)), "quats": matrix_to_quaternion_np(vectors),
        "opacity_logits": np.log(opacity / (1.0 - opacity)), "sh0": mixed("sh0"), "shN": mixed("shN"),
    }
    return {k: torch.from_numpy(np.concatenate([merged[k], p[k][rest]]).astype(np.float32)) for k in merged}


def _tree(means: np.ndarray, chunk_count: int, chunk_extent: float) -> dict:
    """The space partition over ``means`` (level 0): inner nodes {axis, at, left, right}, leaves {leaf: index}."""
    leaves = [0]

    def split(index: np.ndarray) -> dict:
        span = means[index].max(0) - means[index].min(0) if len(index) else np.zeros(3)
        if len(index) <= 1 or (len(index) <= chunk_count and span.max() <= chunk_extent):
            leaves[0] += 1
            return {"leaf": leaves[0] - 1}
        axis = int(span.argmax())
        at = float(np.median(means[index, axis]))
        left = index[means[index, axis] < at]
        if len(left) == 0 or len(left) == len(index):  # many equal values: split by count instead
            left = index[np.argsort(means[index, axis], kind="stable")[: len(index) // 2]]
            at = float(means[left, axis].max()) + 1e-9 * max(1.0, abs(float(means[left, axis].max())))
        right = index[means[index, axis] >= at]
        return {"axis": axis, "at": at, "left": split(left), "right": split(right)}

    return split(np.arange(len(means)))


def _leaf_of(node: dict, points: np.ndarray) -> np.ndarray:
    """[N] the leaf of the partition each point falls in."""
    out = np.zeros(len(points), dtype=np.int64)

    def walk(node: dict, index: np.ndarray) -> None:
        if "leaf" in node:
            out[index] = node["leaf"]
            return
        below = points[index, node["axis"]] < node["at"]
        walk(node["left"], index[below])
        walk(node["right"], index[~below])

    walk(node, np.arange(len(points)))
    return out


def save_sog_lod(folder: str | Path, params: dict[str, Tensor], keep: Tensor | None = None, sh_degree: int | None = None,
                 levels: int = 3, chunk_count: int = CHUNK_COUNT, chunk_extent: float = CHUNK_EXTENT,
                 sh_palette: int = 0) -> Path:
    """Write ``levels`` levels of detail as a streamed SOG under ``folder`` (its ``lod-meta.json``, returned);
    ``keep`` [N] (bool) selects Gaussians, ``sh_degree`` cuts the SH bands."""
    if levels < 1:
        raise ValueError(f"levels of detail must be at least 1, got {levels}")
    folder = Path(folder)
    folder = folder.parent if folder.name == META else folder  # the export table names the lod-meta.json itself
    level_params = [{k: v.detach().float().cpu() for k, v in pruned(params, keep, sh_degree).items()}]
    for _ in range(1, levels):
        if len(level_params[-1]["means"]) <= 1:
            break
        level_params.append(merge_pairs(level_params[-1]))
    means0 = level_params[0]["means"].double().numpy()
    tree = _tree(means0, chunk_count, chunk_extent)
    ranges: dict[int, dict[str, dict]] = {}
    bounds: dict[int, list[np.ndarray]] = {}
    filenames, counts = [], []
    for level, p in enumerate(level_params):
        means = p["means"].double().numpy()
        leaf = _leaf_of(tree, means)
        order = np.lexsort((morton_order(means).argsort(), leaf))  # by leaf, Morton order inside each
        p = {k: v[torch.from_numpy(order)] for k, v in p.items()}
        leaf = leaf[order]
        name = f"{level}_0/meta.json"
        filenames.append(name)
        counts.append(len(order))
        with zipfile.ZipFile(io.BytesIO(encode_sog(p, sort=False, sh_palette=sh_palette))) as bundle:
            for entry in bundle.namelist():
                atomic_write_bytes(folder / f"{level}_0" / entry, bundle.read(entry))
        starts = np.flatnonzero(np.diff(leaf, prepend=-1))
        for start, stop in zip(starts, list(starts[1:]) + [len(leaf)]):
            index = int(leaf[start])
            ranges.setdefault(index, {})[str(level)] = {"file": level, "offset": int(start), "count": int(stop - start)}
            means, quats = p["means"][start:stop].double().numpy(), p["quats"][start:stop].double().numpy()
            half = np.abs(quaternion_to_matrix_np(quats)) @ np.exp(p["log_scales"][start:stop].double().numpy())[:, :, None]
            bounds.setdefault(index, []).append(np.concatenate([means - half[:, :, 0], means + half[:, :, 0]]))

    def node_json(node: dict) -> dict:
        if "leaf" in node:
            points = np.concatenate(bounds.get(node["leaf"], [np.zeros((1, 3))]))
            return {"bound": {"min": points.min(0).tolist(), "max": points.max(0).tolist()}, "lods": ranges.get(node["leaf"], {})}
        children = [node_json(node["left"]), node_json(node["right"])]
        return {"bound": {"min": np.minimum(*(np.array(c["bound"]["min"]) for c in children)).tolist(),
                          "max": np.maximum(*(np.array(c["bound"]["max"]) for c in children)).tolist()},
                "children": children}

    meta = {"version": 1, "asset": {"generator": "lift3d"}, "count": sum(counts), "counts": counts,
            "lodLevels": len(counts), "filenames": filenames, "tree": node_json(tree)}
    path = folder / META
    atomic_write_bytes(path, json.dumps(meta).encode())
    return path


def _json(path: Path, what: str) -> dict:
    if path.is_file() and path.stat().st_size > META_BYTES:
        raise SogFormatError(f"{path} is {path.stat().st_size:,} bytes, more than {what}'s JSON needs ({META_BYTES:,})")
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise SogFormatError(f"{path} is missing: {what} needs it (copy the whole folder)") from None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise SogFormatError(f"{path} is not readable JSON ({error}): is it complete?") from None
    if not isinstance(record, dict):
        raise SogFormatError(f"{path} is not a JSON object: {what} starts with one")
    return record


def _named_files(record) -> set[str]:
    """Every file a SOG meta.json names (the ``files`` lists of its parts)."""
    if isinstance(record, dict):
        named = {f for f in record.get("files", []) if isinstance(f, str)} if isinstance(record.get("files"), list) else set()
        return named.union(*(_named_files(v) for k, v in record.items() if k != "files"))
    return set()


def load_unbundled_sog(path: str | Path) -> dict[str, Tensor]:
    """Pre-activation parameters of an unbundled SOG: its ``meta.json`` and the WebP images it names beside it (what
    splat-transform writes for a ``meta.json`` output, and each file of a streamed SOG)."""
    path = Path(path)
    meta = _json(path, "an unbundled SOG")
    images = [path.parent / name for name in sorted(_named_files(meta))]
    for image in images:
        if not image.resolve().is_relative_to(path.parent.resolve()):
            raise SogFormatError(f"{path} names {image.name}, which lies outside its folder {path.parent}")
        if not image.is_file():
            raise SogFormatError(f"{path} names {image.name}, which is not beside it: copy the whole folder")
    GAUSSIAN_FILE_BYTES.check(str(path.parent), sum(image.stat().st_size for image in images), SogFormatError,
                              "keep fewer Gaussians in it")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as bundle:  # as the bundle the .sog reader takes
        bundle.writestr("meta.json", json.dumps(meta))
        for image in images:
            bundle.writestr(image.name, image.read_bytes())
    return decode_sog(buffer.getvalue(), str(path))


def bundle_meta(path: str | Path) -> Path | None:
    """The ``lod-meta.json`` of a streamed SOG given as that file or as its folder; None for anything else."""
    path = Path(path)
    if path.is_dir():
        return path / META if (path / META).is_file() else None
    return path if path.name.lower().endswith(META) and path.is_file() else None


def _leaves(node: dict):
    if isinstance(node, dict):
        if "lods" in node:
            yield node
        for child in node.get("children", []) or []:
            yield from _leaves(child)


def load_sog_lod(path: str | Path, level: int = 0) -> dict[str, Tensor]:
    """Pre-activation parameters of one level of a streamed SOG (``lod-meta.json`` or its folder; level 0: the
    finest), in lift3d's world: every leaf's range of that level, from whichever of the level's files holds it (one
    per level as lift3d writes them, several as splat-transform does), plus the environment Gaussians if any."""
    path = Path(path)
    path = path / META if path.is_dir() else path
    meta = _json(path, "a streamed SOG")
    try:
        levels, filenames = int(meta["lodLevels"]), list(meta["filenames"])
        spans = sorted({(int(r["file"]), int(r["offset"]), int(r["count"]))
                        for leaf in _leaves(meta["tree"]) for key, r in leaf["lods"].items() if int(key) == level})
    except (KeyError, TypeError, ValueError) as error:
        raise SogFormatError(f"{path} lacks or misstates {error}: a streamed SOG's lod-meta.json has lodLevels, "
                             "filenames and a tree of leaves with lods") from None
    if not 0 <= level < levels:
        raise ValueError(f"{path} has levels 0..{levels - 1}, not {level}")
    units: dict[int, dict[str, Tensor]] = {}
    parts = []
    for file, offset, count in spans:
        if not 0 <= file < len(filenames):
            raise SogFormatError(f"{path}: a leaf names file {file} of {len(filenames)}")
        if file not in units:
            units[file] = load_unbundled_sog(path.parent / filenames[file])
        if offset + count > len(units[file]["means"]):
            raise SogFormatError(f"{path}: a leaf reads Gaussians {offset}..{offset + count} of {filenames[file]}, "
                                 f"which holds {len(units[file]['means'])}")
        parts.append({k: v[offset: offset + count] for k, v in units[file].items()})
    if isinstance(meta.get("environment"), str):  # Gaussians shown at every level (a sky), in splat-transform's bundles
        parts.append(load_unbundled_sog(path.parent / meta["environment"]))
    if not parts:
        raise SogFormatError(f"{path} holds no Gaussians of level {level}")
    degree_bands = min(part["shN"].shape[1] for part in parts)
    return {k: torch.cat([part[k][:, :degree_bands] if k == "shN" else part[k] for part in parts]) for k in parts[0]}


def load_sog_json(path: str | Path) -> dict[str, Tensor]:
    """The Gaussians of a SOG JSON: a streamed SOG's ``lod-meta.json`` (its finest level) or an unbundled SOG's
    ``meta.json`` (e.g. one level of a streamed SOG, ``<folder>/1_0/meta.json``)."""
    path = Path(path)
    meta = _json(path, "a SOG")
    if "lodLevels" in meta or path.name.lower().endswith(META):
        return load_sog_lod(path)
    if "means" in meta:
        return load_unbundled_sog(path)
    raise SogFormatError(f"{path} is neither a streamed SOG's lod-meta.json nor an unbundled SOG's meta.json: lift3d "
                         "reads Gaussians from those two JSON files (and their folder)")


register_codec(".json", load_sog_json, None,
               "PlayCanvas's streamed SOG (lod-meta.json, or its folder) or unbundled SOG (meta.json)")

"""Gaussian PLY files in the layout of 3DGS (what splat viewers and editors open).

One ``vertex`` element, float32 properties in this order: ``x y z nx ny nz f_dc_0..2 f_rest_0..M-1
opacity scale_0..2 rot_0..3`` with pre-activation values (logit opacity, log scale, wxyz quaternion)
and ``f_rest`` channel-major (all red coefficients, then green, then blue); M = 0, 9, 24 or 45 for
SH degree 0..3. Normals are written as zeros and ignored when reading.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lift3d.gaussians.formats.codec import (
    PlyFormatError,
    check_count,
    check_file_size,
    finite_gaussians,
    register_codec,
    write_file,
)
from lift3d.sh import degree_of, num_bases

REST_COUNTS = {0: 0, 1: 9, 2: 24, 3: 45}
HEADER_BYTES = 1 << 16  # a PLY header longer than this is not a Gaussian file's
TYPE_BYTES = {"char": 1, "uchar": 1, "int8": 1, "uint8": 1, "short": 2, "ushort": 2, "int16": 2, "uint16": 2, "int": 4,
              "uint": 4, "int32": 4, "uint32": 4, "float": 4, "float32": 4, "double": 8, "float64": 8}


def property_names(n_rest: int) -> list[str]:
    """The 3DGS property order for ``n_rest`` f_rest coefficients."""
    return (["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"] + [f"f_rest_{i}" for i in range(n_rest)]
            + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"])


def gaussians_to_array(params: dict[str, Tensor]) -> np.ndarray:
    """Structured float32 array (one record per Gaussian) from pre-activation parameters."""
    n = len(params["means"])
    rest = params["shN"].detach().float().cpu()  # [N, K-1, 3]
    n_rest = rest.shape[1] * 3
    columns = [
        params["means"].detach().float().cpu(),
        torch.zeros(n, 3),
        params["sh0"].detach().float().cpu().reshape(n, 3),
        rest.transpose(1, 2).reshape(n, n_rest),  # channel-major
        params["opacity_logits"].detach().float().cpu().reshape(n, 1),
        params["log_scales"].detach().float().cpu(),
        params["quats"].detach().float().cpu(),
    ]
    flat = torch.cat(columns, dim=1).numpy()
    record = np.empty(n, dtype=[(name, "<f4") for name in property_names(n_rest)])
    for i, name in enumerate(record.dtype.names):
        record[name] = flat[:, i]
    return record


def save_ply(path: str | Path, gaussians, keep: Tensor | None = None, sh_degree: int | None = None) -> Path:
    """Write a model (or a dict of its parameters) as a binary little-endian 3DGS PLY, atomically; ``keep`` [N]
    (bool) selects Gaussians, ``sh_degree`` cuts the SH bands (smaller files)."""
    from plyfile import PlyData, PlyElement

    params = gaussians.parameters_dict() if hasattr(gaussians, "parameters_dict") else gaussians
    params = pruned(params, keep, sh_degree)
    element = PlyElement.describe(gaussians_to_array(params), "vertex")
    buffer = io.BytesIO()
    PlyData([element], text=False, byte_order="<").write(buffer)
    return write_file(path, buffer.getvalue())


def check_header(path: Path) -> None:
    """Refuse a PLY whose header claims more vertices than ``GAUSSIANS``, or more than its body can hold, from the
    header alone (plyfile would allocate what the header claims before reading a vertex)."""
    with open(path, "rb") as handle:
        head = handle.read(HEADER_BYTES)
    end = head.find(b"end_header")
    if not head.startswith(b"ply") or end < 0:
        return  # not a PLY, or a header without its end: plyfile says what is wrong
    body = path.stat().st_size - (head.index(b"\n", end) + 1 if b"\n" in head[end:] else len(head))
    binary = b"binary_" in head[:end]
    element, sizes = None, {}
    for line in head[:end].decode("ascii", "replace").splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "element":
            element = words[1]
            count = int(words[2]) if words[2].isdigit() else -1
            if element == "vertex":
                check_count(count, str(path))
            sizes[element] = [max(count, 0), 0]
        elif len(words) == 3 and words[0] == "property" and element in sizes:
            sizes[element][1] += TYPE_BYTES.get(words[1], 1)
    need = sum(count * (size if binary else 2) for count, size in sizes.values())  # text: a digit and a space at least
    if need > body:
        raise PlyFormatError(f"{path} is truncated or corrupt: its header counts {sizes.get('vertex', [0])[0]:,} vertices, "
                             f"which need {need:,} bytes, and the file holds {body:,} after the header")


def _read(path: Path):
    from plyfile import PlyData

    if not path.is_file():
        raise FileNotFoundError(f"Gaussian PLY not found: {path}")
    check_file_size(path)
    check_header(path)
    try:
        return PlyData.read(str(path))
    except Exception as error:  # plyfile raises several types for bad headers and short bodies
        kind = "truncated or corrupt" if "end" in str(error).lower() or "early" in str(error).lower() else "not a readable PLY"
        raise PlyFormatError(f"{path} is {kind}: {error}") from None


def load_ply(path: str | Path, sh_degree: int | None = None) -> dict[str, Tensor]:
    """Pre-activation parameters (``means``, ``log_scales``, ``quats``, ``opacity_logits``, ``sh0``,
    ``shN``) from a 3DGS PLY. ``sh_degree`` pads missing higher SH bands with zeros (or drops extra ones);
    by default the file's own degree is kept."""
    path = Path(path)
    ply = _read(path)
    if "vertex" not in [e.name for e in ply.elements]:
        raise PlyFormatError(f"{path} has no 'vertex' element; a Gaussian PLY stores one vertex per Gaussian")
    vertex = ply["vertex"]
    names = list(vertex.data.dtype.names or ())
    n_rest = sum(name.startswith("f_rest_") for name in names)
    required = [n for n in property_names(n_rest) if n not in ("nx", "ny", "nz")]
    missing = [n for n in required if n not in names]
    if missing:
        raise PlyFormatError(f"{path} lacks the Gaussian properties {', '.join(missing)} "
                             "(the 3DGS layout: x y z f_dc_0..2 [f_rest_*] opacity scale_0..2 rot_0..3)")
    degrees = {count: degree for degree, count in REST_COUNTS.items()}
    if n_rest not in degrees:
        raise PlyFormatError(f"{path} has {n_rest} f_rest properties; expected 0, 9, 24 or 45 (SH degree 0..3)")
    wrong = [f"{n} ({vertex.data.dtype[n]})" for n in required if vertex.data.dtype[n].kind != "f"]
    if wrong:
        raise PlyFormatError(f"{path}: properties {', '.join(wrong)} are not floating point; the 3DGS layout stores float32")
    n = len(vertex.data)
    ignored = [name for name in names if name not in property_names(n_rest)]
    if ignored:
        logging.getLogger("lift3d.gaussians").info("%s: ignored the properties %s (not part of the 3DGS layout)",
                                                    path.name, ", ".join(ignored))

    def column(*keys: str) -> Tensor:
        return torch.from_numpy(np.stack([np.asarray(vertex.data[k], dtype=np.float32) for k in keys], axis=-1))

    rest = column(*[f"f_rest_{i}" for i in range(n_rest)]) if n_rest else torch.zeros(n, 0)
    file_degree = degrees[n_rest]
    params = {
        "means": column("x", "y", "z"),
        "log_scales": column("scale_0", "scale_1", "scale_2"),
        "quats": column("rot_0", "rot_1", "rot_2", "rot_3"),
        "opacity_logits": column("opacity")[:, 0],
        "sh0": column("f_dc_0", "f_dc_1", "f_dc_2")[:, None, :],
        "shN": rest.reshape(n, 3, n_rest // 3).transpose(1, 2).contiguous(),
    }
    params = finite_gaussians(params, str(path))
    if sh_degree is not None and sh_degree != file_degree:
        params = with_sh_degree(params, sh_degree)
    return params


def pruned(params: dict[str, Tensor], keep: Tensor | None = None, sh_degree: int | None = None) -> dict[str, Tensor]:
    """The export pruning every Gaussian file writer applies: the Gaussians ``keep`` [N] (bool) selects, SH bands
    cut to ``sh_degree`` (None: all of either)."""
    if keep is not None:
        keep = keep.to(params["means"].device)
        params = {name: value[keep] for name, value in params.items()}
    if sh_degree is not None and sh_degree < degree_of(params["shN"].shape[1] + 1):
        params = with_sh_degree(params, sh_degree)
    return params


def with_sh_degree(params: dict[str, Tensor], sh_degree: int) -> dict[str, Tensor]:
    """The parameters with SH bands up to ``sh_degree``: higher ones dropped, missing ones zero."""
    k = num_bases(sh_degree) - 1
    shN = params["shN"][:, :k]
    return {**params, "shN": torch.cat([shN, shN.new_zeros(len(shN), k - shN.shape[1], 3)], dim=1)}


register_codec(".ply", load_ply, save_ply, "the 3DGS .ply")

"""The gsplat backend: one call to ``gsplat.rasterization`` (CUDA; gsplat JIT-builds its kernels once).

Returns the same dict as ``lift3d.render.splat_torch.rasterize_torch`` so the front-end treats both alike.
"""

from __future__ import annotations

import importlib.util

import torch
from torch import Tensor


def gsplat_available() -> bool:
    """True when gsplat is installed (whether its CUDA build works shows on the first call)."""
    return importlib.util.find_spec("gsplat") is not None


def rasterize_gsplat(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4] wxyz
    scales: Tensor,  # [N, 3] activated
    opacities: Tensor,  # [N] activated
    colors: Tensor,  # [N, K, 3] SH when sh_degree is set, else [N, D] or [C, N, D]
    viewmats: Tensor,  # [C, 4, 4] world-to-camera, OpenCV axes
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    backgrounds: Tensor,  # [C, D]
    sh_degree: int | None = None,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    eps2d: float = 0.3,
    tile_size: int = 16,
    absgrad: bool = False,
    with_depth: bool = True,
) -> dict[str, Tensor]:
    """``render`` [C, H, W, D+1] (colours + accumulated depth; [C, H, W, D] without ``with_depth``), ``alpha``, ``means2d`` [C, N, 2] (whose
    ``.grad``/``.absgrad`` feed densification), ``radii`` [C, N, 2] int32, ``depths`` [C, N]."""
    from gsplat import rasterization

    def prepare(t: Tensor) -> Tensor:
        return t.float().contiguous()

    render, alpha, meta = rasterization(
        prepare(means), prepare(quats), prepare(scales), prepare(opacities), prepare(colors),
        prepare(viewmats), prepare(Ks), width, height,
        near_plane=near_plane, far_plane=far_plane, eps2d=eps2d, sh_degree=sh_degree,
        packed=False, tile_size=tile_size, backgrounds=prepare(backgrounds), render_mode="RGB+D" if with_depth else "RGB",
        absgrad=absgrad, rasterize_mode="classic",
    )  # fmt: skip
    radii = meta["radii"]
    if radii.ndim == means.ndim:  # gsplat < 1.5 returns one radius per Gaussian
        radii = radii[..., None].expand(*radii.shape, 2)
    return {"render": render, "alpha": alpha, "means2d": meta["means2d"], "radii": radii.to(torch.int32),
            "depths": meta["depths"]}

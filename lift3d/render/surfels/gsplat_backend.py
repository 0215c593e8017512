"""The gsplat backend: gsplat's ``rasterization_2dgs`` (CUDA; gsplat JIT-builds its kernels once), returning the dict of
``render.surfels.torch_backend.rasterize_surfels_torch``."""

from __future__ import annotations

import torch
from torch import Tensor

from lift3d.render.splats.gsplat_backend import _radius_pairs
from lift3d.render.surfels.torch_backend import gradient_into


def rasterize_surfels_gsplat(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4] wxyz
    scales: Tensor,  # [N, 2] or [N, 3] activated (the third is ignored)
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
    radius_clip: float = 0.0,
    tile_size: int = 16,
) -> dict[str, Tensor]:
    """One ``rasterization_2dgs`` call per view (gsplat 1.4 turns every view's normals by the first view's rotation),
    in "RGB+D" mode with the distortion on; the outputs of the views concatenated."""
    from gsplat import rasterization_2dgs

    if scales.shape[-1] == 2:  # gsplat reads [N, 3] and ignores the third
        scales = torch.cat([scales, torch.ones_like(scales[:, :1])], dim=-1)
    means, quats, scales, opacities, colors, viewmats, Ks, backgrounds = (
        t.float().contiguous() for t in (means, quats, scales, opacities, colors, viewmats, Ks, backgrounds))
    per_view = colors.ndim == 3 and sh_degree is None  # [C, N, D] colors
    views: list[dict[str, Tensor]] = []
    # filled by the backward pass, each view into its own slice (a buffer concatenated now would stay zeros)
    densify_grad = torch.zeros(viewmats.shape[0], means.shape[0], 2, device=means.device, dtype=means.dtype)
    for c in range(viewmats.shape[0]):
        render, alpha, normal, _, distortion, median, meta = rasterization_2dgs(
            means, quats, scales, opacities, colors[c] if per_view else colors, viewmats[c : c + 1], Ks[c : c + 1],
            width, height, near_plane=near_plane, far_plane=far_plane, radius_clip=radius_clip, sh_degree=sh_degree,
            packed=False, tile_size=tile_size, backgrounds=backgrounds[c : c + 1], render_mode="RGB+D", distloss=True)
        gradient_into(densify_grad[c : c + 1], meta["gradient_2dgs"])
        views.append({"render": render[..., :-1], "alpha": alpha, "depth_sum": render[..., -1:], "normal": normal,
                      "median": median, "distortion": distortion, "means2d": meta["means2d"].detach(),
                      "radii": _radius_pairs(meta["radii"], means).to(torch.int32), "depths": meta["depths"]})
    return {**{key: torch.cat([v[key] for v in views]) for key in views[0]}, "densify_grad": densify_grad}

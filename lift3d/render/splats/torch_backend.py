"""Pure-PyTorch Gaussian rasterizer (CPU or GPU) with the numerics of gsplat 1.5's classic mode.

``project_gaussians`` (EWA projection, 0.3 px^2 dilation, culling) -> ``bin_gaussians`` (tiles list
their Gaussians front to back) -> ``composite`` (front-to-back alpha compositing with gsplat's alpha
clamp, 1/255 skip and 1e-4 transmittance stop). See the modules of each step for the details.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lift3d.render.splats.bins import bin_gaussians
from lift3d.render.splats.composite import composite
from lift3d.render.splats.project import covariance_3d, exact_float32_matmuls, project_gaussians
from lift3d.sh import sh_to_color


@exact_float32_matmuls()  # the tile GEMMs of the exponents (the composite's backward sets it again)
def rasterize_torch(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4] wxyz, any norm
    scales: Tensor,  # [N, 3] activated
    opacities: Tensor,  # [N] activated
    colors: Tensor,  # [N, K, 3] SH coefficients when sh_degree is set, else [N, D] or [C, N, D] colors
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
    chunk_elements: int = 1 << 22,
    mode: str = "custom",
    save_elements: int = 1 << 26,
    rasterize_mode: str = "classic",
    absgrad: bool = False,
) -> dict[str, Tensor]:
    """Render C views; returns colors+depth ``render`` [C, H, W, D+1] (depth accumulated, not yet
    normalized), ``alpha`` [C, H, W, 1], ``means2d`` [C, N, 2], ``radii`` [C, N, 2], ``depths`` [C, N].
    ``rasterize_mode="antialiased"``: Mip-Splatting's 2D filter (see ``project_gaussians``). ``absgrad``: the backward
    also sets ``means2d.absgrad`` [C, N, 2], the per-pixel gradients' absolute values summed (as gsplat's)."""
    if rasterize_mode not in ("classic", "antialiased"):
        raise ValueError(f"rasterize_mode must be 'classic' or 'antialiased', got {rasterize_mode!r}")

    proj = project_gaussians(means, covariance_3d(quats, scales), opacities, viewmats, Ks, width, height,
                             eps2d=eps2d, near_plane=near_plane, far_plane=far_plane,
                             antialiased=rasterize_mode == "antialiased")
    C = viewmats.shape[0]
    if sh_degree is not None:
        campos = torch.linalg.inv_ex(viewmats)[0][:, None, :3, 3]  # [C, 1, 3] (inv_ex: no GPU sync)
        rgb = sh_to_color(sh_degree, colors[None], means[None] - campos)  # [C, N, 3]
    else:
        rgb = colors.expand(C, *colors.shape[-2:]) if colors.ndim == 2 else colors
    features = torch.cat([rgb, proj.depths[..., None]], dim=-1)
    backgrounds = torch.cat([backgrounds, backgrounds.new_zeros(C, 1)], dim=-1)
    bins = bin_gaussians(proj, width, height, tile_size, chunk_elements)
    opacity = opacities[None].expand(C, -1)
    if proj.compensations is not None:
        opacity = opacity * proj.compensations
    render, alpha = composite(proj.means2d, proj.conics, opacity, features, backgrounds, bins, width, height, mode,
                              save_elements, absgrad)
    return {"render": render, "alpha": alpha, "means2d": proj.means2d, "radii": proj.radii, "depths": proj.depths}

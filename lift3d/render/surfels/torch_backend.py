"""The pure-PyTorch surfel rasterizer (CPU or GPU): ``project_surfels`` -> tile binning -> ``composite_surfels``.

Returns what ``render.surfels.gsplat_backend`` returns, so the front end treats both alike; the GPU test compares them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lift3d.render.surfels.composite import composite_surfels
from lift3d.render.surfels.project import FILTER_INV_SQUARE, project_surfels


def gradient_into(buffer: Tensor, tensor: Tensor) -> None:
    """Copy ``tensor``'s gradient into ``buffer`` when the backward pass computes it (a tensor hook)."""
    if tensor.requires_grad:
        def hook(grad: Tensor) -> None:
            buffer.copy_(grad)

        tensor.register_hook(hook)


def densify_handle(means2d: Tensor, T: Tensor, requires_grad: bool) -> tuple[Tensor, Tensor]:
    """(a leaf [C, N, 2] holding ``means2d``, the ray transforms [C, N, 3, 3] with a zero-valued term of it): after
    backward the leaf's gradient is that of the surfel's projected center moved in the image, ``dL/dT[:2, 2]`` times its
    depth (gsplat's ``gradient_2dgs``), the signal 2DGS densifies by."""
    handle = means2d.detach().requires_grad_(requires_grad)
    if not requires_grad:
        return handle, T
    shift = (handle - handle.detach()) * T[..., 2, 2:3].detach()  # [C, N, 2], zero valued
    column = torch.cat([shift, torch.zeros_like(shift[..., :1])], dim=-1)
    zeros = torch.zeros_like(column)
    return handle, T + torch.stack([zeros, zeros, column], dim=-1)


def rasterize_surfels_torch(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4] wxyz, any norm
    scales: Tensor,  # [N, 2] or [N, 3] activated (the third is ignored)
    opacities: Tensor,  # [N] activated
    colors: Tensor,  # [N, K, 3] SH coefficients when sh_degree is set, else [N, D] or [C, N, D]
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
    chunk_elements: int = 1 << 22,
    save_elements: int = 1 << 26,
    low_pass: float = FILTER_INV_SQUARE,
) -> dict[str, Tensor]:
    """Render C views: ``render`` [C, H, W, D] over the backgrounds, ``alpha``, ``depth_sum`` (sum w z), ``median``,
    ``distortion`` [C, H, W, 1], ``normal`` [C, H, W, 3] (world, accumulated), ``means2d`` [C, N, 2] (box centers),
    ``densify_grad`` [C, N, 2] (zeros that the backward pass fills with the gradient densification reads), ``radii``
    [C, N, 2], ``depths`` [C, N]."""
    from lift3d.sh import sh_to_color  # lazily, as the 3D Gaussian rasterizer does

    proj = project_surfels(means, quats, scales, viewmats, Ks, width, height, near_plane, far_plane, radius_clip)
    C = viewmats.shape[0]
    if sh_degree is not None:
        campos = torch.linalg.inv_ex(viewmats)[0][:, None, :3, 3]  # [C, 1, 3]
        rgb = sh_to_color(sh_degree, colors[None], means[None] - campos)  # [C, N, 3]
    else:
        rgb = colors.expand(C, *colors.shape[-2:]) if colors.ndim == 2 else colors
    wants_grad = torch.is_grad_enabled() and means.requires_grad
    densify, T = densify_handle(proj.means2d, proj.ray_transforms, wants_grad)
    densify_grad = torch.zeros_like(densify)
    gradient_into(densify_grad, densify)
    features = torch.cat([rgb, proj.depths[..., None], proj.normals], dim=-1)
    out = composite_surfels(proj, opacities[None].expand(C, -1), features, width, height, tile_size, chunk_elements,
                            save_elements, ray_transforms=T, low_pass=low_pass)
    D, alpha, acc = rgb.shape[-1], out["alpha"], out["features"]
    return {"render": acc[..., :D] + (1 - alpha) * backgrounds[:, None, None, :], "alpha": alpha,
            "depth_sum": acc[..., D : D + 1], "normal": acc[..., D + 1 :], "median": out["median"],
            "distortion": out["distortion"], "means2d": proj.means2d.detach(), "densify_grad": densify_grad, "radii": proj.radii,
            "depths": proj.depths}

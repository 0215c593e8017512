"""Rasterization of Gaussians sharded over ranks, in PyTorch: the CPU twin of gsplat's ``rasterization(...,
distributed=True)`` ("On Scaling Up 3D Gaussian Splatting Training", Zhao et al. 2024), with the same layout.

Every rank holds its own Gaussians and its own cameras (the same number on every rank). The cameras are gathered, each
rank projects its Gaussians into all of them (the projection is distributed over Gaussians), sends each camera's
projected Gaussians (2D means, conics, opacities, colors, depths, radii) to the rank that owns the camera, and every
rank composites its own cameras from the Gaussians of all ranks (the rasterization is distributed over cameras).
Gradients flow back through the same exchange to the Gaussians where they live. As gsplat's, the ``means2d`` and
``radii`` returned are the owner's projection ([C_all, N_local, ...]: every camera, this rank's Gaussians), so
densification statistics land on the rank that holds the Gaussian."""

from __future__ import annotations

import torch
from torch import Tensor

from lift3d.distributed import all_gather_ints, all_gather_rows, exchange, world_size
from lift3d.render.splats.bins import bin_gaussians
from lift3d.render.splats.composite import composite
from lift3d.render.splats.project import Projection, covariance_3d, exact_float32_matmuls, project_gaussians
from lift3d.sh import sh_to_color


@exact_float32_matmuls()
def rasterize_distributed_torch(
    means: Tensor,  # [N, 3] this rank's Gaussians
    quats: Tensor,  # [N, 4]
    scales: Tensor,  # [N, 3] activated
    opacities: Tensor,  # [N] activated
    colors: Tensor,  # [N, K, 3] SH coefficients when sh_degree is set, else [N, D]
    viewmats: Tensor,  # [C, 4, 4] this rank's cameras, OpenCV world-to-camera
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
    save_elements: int = 1 << 26,
    rasterize_mode: str = "classic",
) -> dict[str, Tensor]:
    """``rasterize_torch``'s outputs for this rank's C cameras rendered from the Gaussians of every rank: ``render``
    [C, H, W, D+1], ``alpha`` [C, H, W, 1]; ``means2d`` [C_all, N, 2], ``radii`` [C_all, N, 2] and ``depths``
    [C_all, N] of this rank's Gaussians in every rank's cameras (the owner's side, where their gradients arrive)."""
    n_ranks = world_size()
    C, N = viewmats.shape[0], means.shape[0]
    counts = all_gather_ints([C, N], means)
    if any(row[0] != C for row in counts):
        raise ValueError(f"sharded rendering needs the same number of cameras on every rank, got {[r[0] for r in counts]}")
    sizes = [row[1] for row in counts]
    # every rank's cameras (differentiable: pose corrections get their gradients back)
    cameras = all_gather_rows(torch.cat([viewmats.reshape(C, 16), Ks.reshape(C, 9).to(viewmats)], dim=1))
    all_viewmats, all_Ks = cameras[:, :16].reshape(-1, 4, 4), cameras[:, 16:].reshape(-1, 3, 3)
    proj = project_gaussians(means, covariance_3d(quats, scales), opacities, all_viewmats, all_Ks, width, height,
                             eps2d=eps2d, near_plane=near_plane, far_plane=far_plane,
                             antialiased=rasterize_mode == "antialiased")
    if sh_degree is not None:
        campos = torch.linalg.inv_ex(all_viewmats)[0][:, None, :3, 3]
        rgb = sh_to_color(sh_degree, colors[None], means[None] - campos)  # [C_all, N, 3]
    else:
        rgb = colors.expand(len(all_viewmats), *colors.shape[-2:])
    opacity = opacities[None].expand(len(all_viewmats), -1)
    if proj.compensations is not None:
        opacity = opacity * proj.compensations
    # one row per (camera, Gaussian): 2D mean, conic, opacity, colors, depth, radii (whole numbers, exact in float32)
    rows = torch.cat([proj.means2d, proj.conics, opacity[..., None], rgb, proj.depths[..., None],
                      proj.radii.to(proj.means2d.dtype)], dim=-1)
    width_d = rows.shape[-1]
    received = exchange(rows.reshape(-1, width_d), [C * N] * n_ranks, [C * n for n in sizes])
    # rank s sent [C, N_s] rows: side by side, the Gaussians of all ranks in rank order for this rank's cameras
    blocks = received.split([C * n for n in sizes])
    mine = torch.cat([block.reshape(C, n, width_d) for block, n in zip(blocks, sizes)], dim=1)
    d = rgb.shape[-1]
    means2d, conics, seen_opacity = mine[..., :2], mine[..., 2:5], mine[..., 5]
    features, depths = mine[..., 6 : 6 + d], mine[..., 6 + d]
    radii = mine[..., 7 + d :].detach().round().to(torch.int32)
    view = Projection(means2d=means2d, conics=conics, depths=depths, radii=radii)
    bins = bin_gaussians(view, width, height, tile_size, chunk_elements)
    features = torch.cat([features, depths[..., None]], dim=-1)
    backgrounds = torch.cat([backgrounds, backgrounds.new_zeros(C, 1)], dim=-1)
    render, alpha = composite(means2d, conics, seen_opacity, features, backgrounds, bins, width, height, "custom",
                              save_elements, False)
    return {"render": render, "alpha": alpha, "means2d": proj.means2d, "radii": proj.radii, "depths": proj.depths}

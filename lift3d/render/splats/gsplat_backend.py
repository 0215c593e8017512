"""The gsplat backend: one call to ``gsplat.rasterization`` (CUDA; gsplat JIT-builds its kernels once).

Returns the same dict as ``lift3d.render.splats.torch_backend.rasterize_torch`` so the front-end treats both alike.
"""

from __future__ import annotations

import importlib.util
import inspect

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
    rasterize_mode: str = "classic",
    capacity: int = 0,
    distributed: bool = False,
) -> dict[str, Tensor]:
    """``render`` [C, H, W, D+1] (colors + accumulated depth; [C, H, W, D] without ``with_depth``), ``alpha``,
    ``means2d`` [C, N, 2] (whose ``.grad``/``.absgrad`` feed densification), ``radii`` [C, N, 2] int32,
    ``depths`` [C, N]. ``capacity`` > 0: the tile intersections go into that many fixed slots (``_rasterize_fixed``)
    and ``isect_count`` is added. ``distributed``: gsplat's sharded rendering (this rank's Gaussians, its own cameras,
    as many on every rank); ``means2d``, ``radii`` and ``depths`` are then the projection of this rank's Gaussians
    into every rank's cameras, as gsplat's meta holds them (set before its all-to-all)."""
    means, quats, scales, opacities, colors, viewmats, Ks, backgrounds = (
        t.float().contiguous() for t in (means, quats, scales, opacities, colors, viewmats, Ks, backgrounds))
    if capacity > 0:
        return _rasterize_fixed(means, quats, scales, opacities, colors, viewmats, Ks, width, height, backgrounds,
                                capacity, sh_degree, near_plane, far_plane, eps2d, tile_size, absgrad, with_depth,
                                rasterize_mode)
    from gsplat import rasterization

    render, alpha, meta = rasterization(
        means, quats, scales, opacities, colors, viewmats, Ks, width, height,
        near_plane=near_plane, far_plane=far_plane, eps2d=eps2d, sh_degree=sh_degree,
        packed=False, tile_size=tile_size, backgrounds=backgrounds, render_mode="RGB+D" if with_depth else "RGB",
        absgrad=absgrad, rasterize_mode=rasterize_mode, **({"distributed": True} if distributed else {}),
    )  # fmt: skip
    radii = _radius_pairs(meta["radii"], means).to(torch.int32)
    return {"render": render, "alpha": alpha, "means2d": meta["means2d"], "radii": radii, "depths": meta["depths"]}


def _rasterize_fixed(means: Tensor, quats: Tensor, scales: Tensor, opacities: Tensor, colors: Tensor, viewmats: Tensor,
                     Ks: Tensor, width: int, height: int, backgrounds: Tensor, capacity: int, sh_degree: int | None,
                     near_plane: float, far_plane: float, eps2d: float, tile_size: int, absgrad: bool, with_depth: bool,
                     rasterize_mode: str) -> dict[str, Tensor]:
    """``rasterize_gsplat`` (same arguments, float32 and contiguous) with the tile intersections in ``capacity``
    fixed slots (``render.splats.tiles``): gsplat's own projection, SH and rasterization kernels, but no host read of the
    intersection count and no matrix inverse, so the render can be captured in a CUDA graph. Adds ``isect_count``
    (0-dim, device): the pairs this render had; more than ``capacity`` means some were dropped."""
    from gsplat import rasterize_to_pixels, spherical_harmonics

    from lift3d.render.splats.tiles import tile_grid, tile_intersections, tile_masks

    n_views, n = viewmats.shape[0], means.shape[0]
    radii, means2d, depths, conics, compensations = _project(means, quats, scales, opacities, viewmats, Ks, width, height,
                                                             near_plane, far_plane, eps2d, rasterize_mode == "antialiased")
    view_opacities = opacities[None].expand(n_views, n)
    if compensations is not None:  # Mip-Splatting's 2D filter, as gsplat's rasterization applies it
        view_opacities = view_opacities * compensations
    if sh_degree is not None:
        rotation, translation = viewmats[:, :3, :3], viewmats[:, :3, 3:]
        campos = -(rotation.transpose(1, 2) @ translation)[..., 0]  # camera centers: the inverse of a rigid map
        dirs = means[None] - campos[:, None]
        features = colors[None].expand(n_views, *colors.shape)
        view_colors = spherical_harmonics(sh_degree, dirs, features, masks=(radii > 0).all(dim=-1))
        view_colors = torch.clamp_min(view_colors + 0.5, 0.0)
    else:
        view_colors = colors[None].expand(n_views, *colors.shape) if colors.ndim == 2 else colors
    if with_depth:
        view_colors = torch.cat([view_colors, depths[..., None]], dim=-1)
        backgrounds = torch.cat([backgrounds, backgrounds.new_zeros(n_views, 1)], dim=-1)
    tile_width, tile_height = tile_grid(width, height, tile_size)
    offsets, flatten_ids, count = tile_intersections(means2d, radii, depths, tile_size, tile_width, tile_height,
                                                     capacity)
    render, alpha = rasterize_to_pixels(
        means2d, conics, view_colors, view_opacities, width, height, tile_size, offsets, flatten_ids,
        backgrounds=backgrounds, masks=tile_masks(n_views, tile_width, tile_height, means.device),
        absgrad=absgrad)  # fmt: skip
    return {"render": render, "alpha": alpha, "means2d": means2d, "radii": radii.to(torch.int32), "depths": depths,
            "isect_count": count}


def _radius_pairs(radii: Tensor, means: Tensor) -> Tensor:
    """Radii as [C, N, 2]: gsplat < 1.5 returns one radius per Gaussian ([C, N])."""
    if radii.ndim == means.ndim:
        radii = radii[..., None].expand(*radii.shape, 2)
    return radii


@torch.no_grad()
def view_intersections(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4]
    scales: Tensor,  # [N, 3] activated
    opacities: Tensor,  # [N] activated
    viewmats: Tensor,  # [C, 4, 4]
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    eps2d: float = 0.3,
    tile_size: int = 16,
    views_at_once: int = 8,
) -> Tensor:
    """[C] how many tile intersections a render of each view has (gsplat's projection, ``render.splats.tiles``' counting):
    what fixed intersection slots must hold."""
    from lift3d.render.splats.tiles import intersection_counts, tile_grid

    means, quats, scales, opacities = (t.float().contiguous() for t in (means, quats, scales, opacities))
    tile_width, tile_height = tile_grid(width, height, tile_size)
    counts = []
    for start in range(0, viewmats.shape[0], views_at_once):
        views = slice(start, start + views_at_once)
        radii, means2d, _, _, _ = _project(means, quats, scales, opacities, viewmats[views].float().contiguous(),
                                        Ks[views].float().contiguous(), width, height, near_plane, far_plane, eps2d)
        counts.append(intersection_counts(means2d, radii, tile_size, tile_width, tile_height))
    return torch.cat(counts)


def _project(means: Tensor, quats: Tensor, scales: Tensor, opacities: Tensor, viewmats: Tensor, Ks: Tensor, width: int,
             height: int, near_plane: float, far_plane: float, eps2d: float,
             antialiased: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """gsplat's projection as ``rasterization`` calls it -> radii [C, N, 2], means2d, depths, conics, compensations
    ([C, N] with ``antialiased``, else None)."""
    from gsplat import fully_fused_projection

    # gsplat >= 1.5 bounds the radii by the opacity, as its rasterization does
    tighter = {"opacities": opacities} if "opacities" in inspect.signature(fully_fused_projection).parameters else {}
    radii, means2d, depths, conics, compensations = fully_fused_projection(
        means, None, quats, scales, viewmats, Ks, width, height, eps2d=eps2d, near_plane=near_plane,
        far_plane=far_plane, packed=False, calc_compensations=antialiased, **tighter)  # fmt: skip
    return _radius_pairs(radii, means), means2d, depths, conics, compensations

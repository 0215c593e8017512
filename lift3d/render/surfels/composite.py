"""Front-to-back compositing of binned surfels in plain PyTorch, with gsplat's 2DGS rules.

Per pixel, surfels in order of center depth: the ray meets the surfel's plane at local ``s`` (``render.surfels.project``),
``sigma = 1/2 min(|s|^2, 2 |pixel - means2d|^2)`` (the 2DGS low-pass filter keeps sub-pixel surfels visible),
``alpha = min(0.999, o exp(-sigma))``; alphas below 1/255 are skipped, and a pixel finishes, exclusive of the surfel that
would do it, once its transmittance would fall to 1e-4 or below. Besides the accumulated features ``sum w_k f_k`` it
gives the median depth (the depth of the last surfel in front of which the transmittance is above 0.5, 0 where none)
and the depth distortion ``2 sum_k w_k sum_{j<k} w_j (d_k - d_j)`` (gsplat's L1 form of Mip-NeRF 360's).

Tiles come from the 3D Gaussian rasterizer's binning (``render.splats.bins``); a chunk of tiles is composited in depth
blocks, and tiles whose pixels have all finished stop early. Differentiable by autograd; when a render has more
(pixel, surfel) pairs than ``save_elements`` each chunk is checkpointed (recomputed in the backward pass), so memory
stays bounded.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from lift3d.render.splats.bins import TileBins, bin_gaussians, tile_lists, tile_origins, to_image
from lift3d.render.splats.composite import ALPHA_MAX, T_MIN
from lift3d.render.splats.project import ALPHA_THRESHOLD, exact_float32_matmuls
from lift3d.render.surfels.project import FILTER_INV_SQUARE, SurfelProjection

MEDIAN_TRANSMITTANCE = 0.5  # the median depth is that of the last surfel in front of which more than this shows through
BLOCK_ELEMENTS = 1 << 17  # a depth block covers about this many pixel x surfel pairs
MIN_BLOCK = 32  # ... and at least this many surfels


def plane_coefficients(T: Tensor) -> Tensor:
    """[..., 3, 3] Z with ``zeta = Z (x, y, 1)`` for the ray transforms ``T`` [..., 3, 3] (rows u, v, w): the columns
    v x w, w x u, u x v, i.e. ``(x w - u) x (y w - v)``, the cross product of the two planes through pixel (x, y)."""
    u, v, w = T[..., 0, :], T[..., 1, :], T[..., 2, :]
    return torch.stack([torch.linalg.cross(v, w), torch.linalg.cross(w, u), torch.linalg.cross(u, v)], dim=-1)


def surfel_alphas(Z: Tensor, center: Tensor, opacity: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """Alphas [m, b, P] of b surfels (plane coefficients ``Z`` [m, b, 3, 3], filter centers ``center`` [m, b, 2],
    opacities [m, b]) at the pixel centers ``x``, ``y`` [m, P]; 0 below 1/255 or where the ray is parallel to the plane."""
    xs, ys = x[:, None, None, :], y[:, None, None, :]
    zeta = Z[..., 0:1] * xs + Z[..., 1:2] * ys + Z[..., 2:3]  # [m, b, 3, P]
    depth = zeta[:, :, 2]
    hit = depth != 0
    safe = torch.where(hit, depth, torch.ones_like(depth))
    sigma_3d = (zeta[:, :, 0] / safe) ** 2 + (zeta[:, :, 1] / safe) ** 2
    dx, dy = center[..., 0:1] - x[:, None, :], center[..., 1:2] - y[:, None, :]
    sigma_2d = FILTER_INV_SQUARE * (dx * dx + dy * dy)
    alpha = (opacity[..., None] * torch.exp(-0.5 * torch.minimum(sigma_3d, sigma_2d))).clamp(max=ALPHA_MAX)
    return torch.where(hit & (alpha >= ALPHA_THRESHOLD), alpha, torch.zeros_like(alpha))


@exact_float32_matmuls()  # also when a checkpointed chunk is recomputed in the backward pass
def composite_chunk(index: Tensor, x: Tensor, y: Tensor, outside: Tensor, counts: Tensor, Z: Tensor, center: Tensor,
                    opacity: Tensor, features: Tensor, depth: Tensor) -> tuple[Tensor, ...]:
    """One chunk of n tiles of P pixels, each listing K surfels (``index`` [n, K] into the per-surfel arrays, whose
    last row is a surfel of opacity 0 that pads the lists; ``counts`` [n] the lists' true lengths). ``x``, ``y``
    [n, P]: pixel centers; ``outside`` [n, P]: pixels beyond the image. Per-surfel arrays: ``Z`` [S, 3, 3], ``center``
    [S, 2], ``opacity`` [S], ``features`` [S, D], ``depth`` [S]. Returns the accumulated features [n, P, D], the final
    transmittance, the median depth and the distortion [n, P]."""
    n, K = index.shape
    P = x.shape[1]
    acc = features.new_zeros(n, P, features.shape[-1])
    trans, median, distortion, depth_sum = (features.new_ones(n, P), features.new_zeros(n, P),
                                             features.new_zeros(n, P), features.new_zeros(n, P))
    done = outside.clone()
    rows = torch.arange(n, device=index.device)
    size = min(K, max(MIN_BLOCK, BLOCK_ELEMENTS // max(n * P, 1)))
    for start in range(0, K, size):
        stop = min(start + size, K)
        ids = index[rows, start:stop]  # [m, b]
        alpha = surfel_alphas(Z[ids], center[ids], opacity[ids], x[rows], y[rows])
        alpha = torch.where(done[rows][:, None], torch.zeros_like(alpha), alpha)
        t_in = trans[rows]
        after = t_in[:, None] * torch.cumprod(1 - alpha, dim=1)  # transmittance behind each surfel
        before = torch.cat([t_in[:, None], after[:, :-1]], dim=1)
        w = torch.where(after > T_MIN, alpha, torch.zeros_like(alpha)) * before  # [m, b, P]
        d = depth[ids]  # [m, b]
        acc = acc.index_add(0, rows, torch.bmm(w.transpose(1, 2), features[ids]))
        in_front = (w > 0) & (before > MEDIAN_TRANSMITTANCE)
        last = (in_front * torch.arange(1, stop - start + 1, device=w.device)[:, None]).argmax(dim=1)  # [m, P]
        median = median.index_copy(0, rows, torch.where(in_front.any(1), d.gather(1, last), median[rows]))
        wd = w * d[..., None]
        earlier = depth_sum[rows][:, None] + torch.cumsum(wd, dim=1) - wd  # sum_{j<k} w_j d_j
        distortion = distortion.index_add(0, rows, 2 * (w * (d[..., None] * (1 - before) - earlier)).sum(1))
        depth_sum = depth_sum.index_add(0, rows, wd.sum(1))
        trans = trans.index_copy(0, rows, t_in - w.sum(1))
        with torch.no_grad():
            done[rows] = done[rows] | (after[:, -1] <= T_MIN)
            rows = rows[~done[rows].all(-1) & (counts[rows] > stop)]
        if len(rows) == 0:
            break
    return acc, trans, median, distortion


def _chunk_pixels(tiles: Tensor, bins: TileBins, width: int, height: int, dtype: torch.dtype) -> tuple[Tensor, ...]:
    """Pixel centers x, y [n, P] of ``tiles`` (row-major within a tile) and which lie beyond the image [n, P]."""
    local = torch.arange(bins.tile_size * bins.tile_size, device=tiles.device)
    origin = tile_origins(tiles, bins, dtype)
    x = origin[:, None, 0] + (local % bins.tile_size).to(dtype) + 0.5
    y = origin[:, None, 1] + (local // bins.tile_size).to(dtype) + 0.5
    return x, y, (x > width) | (y > height)


def composite_surfels(
    proj: SurfelProjection,
    opacities: Tensor,  # [C, N]
    features: Tensor,  # [C, N, D]
    width: int,
    height: int,
    tile_size: int = 16,
    chunk_elements: int = 1 << 22,
    save_elements: int = 1 << 26,
    ray_transforms: Tensor | None = None,  # [C, N, 3, 3] what the kernels read (default: the projection's)
) -> dict[str, Tensor]:
    """Composite C views: ``features`` [C, H, W, D] accumulated (no background), ``alpha``, ``median`` and
    ``distortion`` [C, H, W, 1]. ``ray_transforms`` may differ from the projection's by a term of zero value that carries
    a gradient (the densification signal); the bounding boxes and filter centers stay the projection's."""
    C, N = proj.depths.shape
    D = features.shape[-1]
    bins = bin_gaussians(proj, width, height, tile_size, chunk_elements)
    T = proj.ray_transforms if ray_transforms is None else ray_transforms

    def flat(t: Tensor) -> Tensor:  # [C, N, ...] -> [C * N + 1, ...], the last row the padding surfel
        t = t.reshape(C * N, *t.shape[2:])
        return torch.cat([t, t.new_zeros((1,) + t.shape[1:])])

    arrays = (flat(plane_coefficients(T)), flat(proj.means2d), flat(opacities), flat(features), flat(proj.depths))
    ids = torch.cat([bins.flat_ids, bins.flat_ids.new_full((1,), C * N)])  # list position -> surfel row
    n_tiles, P = C * bins.tiles_x * bins.tiles_y, tile_size * tile_size
    pairs = sum(len(tiles) * K * P for tiles, K in bins.chunks)
    recompute = torch.is_grad_enabled() and pairs > save_elements and any(a.requires_grad for a in arrays)
    parts, done_tiles = [], []
    for tiles, K in bins.chunks:
        x, y, outside = _chunk_pixels(tiles, bins, width, height, features.dtype)
        args = (ids[tile_lists(bins, tiles, K)], x, y, outside, bins.counts[tiles], *arrays)
        parts.append(checkpoint(composite_chunk, *args, use_reentrant=False) if recompute else composite_chunk(*args))
        done_tiles.append(tiles)
    acc, trans = features.new_zeros(n_tiles, P, D), features.new_ones(n_tiles, P)
    median, distortion = features.new_zeros(n_tiles, P), features.new_zeros(n_tiles, P)
    if parts:
        tiles = torch.cat(done_tiles)
        acc = acc.index_copy(0, tiles, torch.cat([p[0] for p in parts]))
        trans = trans.index_copy(0, tiles, torch.cat([p[1] for p in parts]))
        median = median.index_copy(0, tiles, torch.cat([p[2] for p in parts]))
        distortion = distortion.index_copy(0, tiles, torch.cat([p[3] for p in parts]))

    def image(t: Tensor) -> Tensor:
        return to_image(t if t.ndim == 3 else t[..., None], bins, width, height)

    return {"features": image(acc), "alpha": 1 - image(trans), "median": image(median), "distortion": image(distortion)}

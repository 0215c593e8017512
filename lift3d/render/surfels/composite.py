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

import math
from dataclasses import replace

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from lift3d.render.splats.bins import TileBins, bin_gaussians, tile_lists, tile_origins, to_image
from lift3d.render.splats.composite import ALPHA_MAX, T_MIN, pixel_features
from lift3d.render.splats.project import ALPHA_THRESHOLD, exact_float32_matmuls
from lift3d.render.surfels.project import FILTER_INV_SQUARE, MAX_EXTENT, SurfelProjection

MEDIAN_TRANSMITTANCE = 0.5  # the median depth is that of the last surfel in front of which more than this shows through
BLOCK_ELEMENTS = 1 << 17  # a depth block covers about this many pixel x surfel pairs
MIN_BLOCK = 32  # ... and at least this many surfels
SIGMA_BEYOND = 2 * math.log(1 / ALPHA_THRESHOLD) + 1  # |s|^2 past which alpha < 1/255 at any opacity (bounded there)


def plane_coefficients(T: Tensor) -> Tensor:
    """[..., 3, 3] Z with ``zeta = Z (x, y, 1)`` for the ray transforms ``T`` [..., 3, 3] (rows u, v, w): the columns
    v x w, w x u, u x v, i.e. ``(x w - u) x (y w - v)``, the cross product of the two planes through pixel (x, y)."""
    u, v, w = T[..., 0, :], T[..., 1, :], T[..., 2, :]
    return torch.stack([torch.linalg.cross(v, w), torch.linalg.cross(w, u), torch.linalg.cross(u, v)], dim=-1)


def entry_coefficients(Z: Tensor, center: Tensor, origin: Tensor, low_pass: float = FILTER_INV_SQUARE) -> Tensor:
    """[..., 4, 6] for (tile, surfel) entries (``Z`` [..., 3, 3], filter ``center`` [..., 2], tile ``origin`` [..., 2]):
    the coefficients over the tile-local monomials (1, u, v, u^2, uv, v^2) of ``zeta = Z (origin + (u, v), 1)`` (three
    rows, linear) and of ``low_pass |pixel - center|^2``: the kernel's terms at a tile's pixels then come from one matrix
    product. Each zeta is squared only after it is evaluated: the expanded square of an edge-on surfel's zeta cancels
    to a fraction of float32's precision, where gsplat's per-pixel cross product does not."""
    a, b = Z[..., 0], Z[..., 1]  # [..., 3] the coefficients of x and y in each component of zeta
    c = Z[..., 2] + a * origin[..., None, 0] + b * origin[..., None, 1]
    zero = torch.zeros_like(c)
    planes = torch.stack([c, a, b, zero, zero, zero], dim=-1)  # [..., 3, 6]
    dx, dy = (center - origin).unbind(-1)
    zero = zero[..., 0]
    filter_2d = [low_pass * (dx * dx + dy * dy), -2 * low_pass * dx, -2 * low_pass * dy,
                 zero + low_pass, zero, zero + low_pass]
    return torch.cat([planes, torch.stack(filter_2d, -1)[..., None, :]], dim=-2)


def surfel_alphas(coefficients: Tensor, opacity: Tensor, monomials: Tensor) -> Tensor:
    """Alphas [m, b, P] of b surfels per tile (``coefficients`` [m, b, 4, 6] from ``entry_coefficients``, opacities
    [m, b]) at the tile's pixels (``monomials`` [P, 6]); 0 below 1/255 or where the ray is parallel to the plane."""
    m, b = opacity.shape
    terms = (coefficients.reshape(m * b * 4, 6) @ monomials.T).reshape(m, b, 4, -1)
    zeta_u, zeta_v, depth, sigma_2d = terms.unbind(2)
    hit = depth != 0
    # |s|^2 = (zeta_u^2 + zeta_v^2) / zeta_w^2, bounded by SIGMA_BEYOND before it is divided out: a ray nearly parallel
    # to the plane would overflow it to inf, and the gradient through the minimum (0 x inf) would be NaN
    squared, scale = zeta_u * zeta_u + zeta_v * zeta_v, depth * depth
    near = hit & (squared < SIGMA_BEYOND * scale)
    sigma_3d = torch.where(near, squared / torch.where(near, scale, torch.ones_like(scale)), torch.full_like(scale, SIGMA_BEYOND))
    alpha = (opacity[..., None] * torch.exp(-0.5 * torch.minimum(sigma_3d, sigma_2d))).clamp(max=ALPHA_MAX)
    return torch.where(hit & (alpha >= ALPHA_THRESHOLD), alpha, torch.zeros_like(alpha))


@exact_float32_matmuls()  # also when a checkpointed chunk is recomputed in the backward pass
def composite_chunk(entries: Tensor, index: Tensor, monomials: Tensor, outside: Tensor, counts: Tensor,
                    coefficients: Tensor, opacity: Tensor, features: Tensor, depth: Tensor) -> tuple[Tensor, ...]:
    """One chunk of n tiles of P pixels, each listing K surfels: ``entries`` [n, K] into the per-entry ``coefficients``
    [E, 4, 6] (``entry_coefficients``; the last row, all zeros, pads the lists) and ``index`` [n, K] into the
    per-surfel arrays (``opacity`` [S], ``features`` [S, D], ``depth`` [S]); ``counts`` [n] the lists' true lengths.
    ``monomials`` [P, 6]: of the tile-local pixel centers; ``outside`` [n, P]: pixels beyond the image. Returns the
    accumulated features [n, P, D], the final transmittance, the median depth and the distortion [n, P]."""
    n, K = index.shape
    P = monomials.shape[0]
    acc = features.new_zeros(n, P, features.shape[-1])
    trans, median, distortion, depth_sum = (features.new_ones(n, P), features.new_zeros(n, P),
                                             features.new_zeros(n, P), features.new_zeros(n, P))
    done = outside.clone()
    rows = torch.arange(n, device=index.device)
    size = min(K, max(MIN_BLOCK, BLOCK_ELEMENTS // max(n * P, 1)))
    for start in range(0, K, size):
        stop = min(start + size, K)
        ids = index[rows, start:stop]  # [m, b]
        alpha = surfel_alphas(coefficients[entries[rows, start:stop]], opacity[ids], monomials)
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


def reaching_radii(radii: Tensor, opacities: Tensor, low_pass: float = FILTER_INV_SQUARE) -> Tensor:
    """[C, N, 2] the screen boxes (``radii``, 3.33 sigma) cut to where a surfel of opacity ``opacities`` [C, N] can
    reach alpha 1/255: |s| <= sqrt(2 ln(255 o)) for its kernel, sqrt(2 ln(255 o) / low_pass) pixels for its low-pass
    filter. Tiles outside them would composite nothing of it: binning by them changes no pixel, and skips that work."""
    with torch.no_grad():
        log_reach = torch.log((opacities.detach() / ALPHA_THRESHOLD).clamp_min(1.0))[..., None]  # ln(255 o)
        kernel = torch.ceil(torch.sqrt(2 * log_reach) / MAX_EXTENT * radii)
        blur = torch.ceil(torch.sqrt(2 * log_reach / low_pass))
        return torch.minimum(radii, torch.maximum(kernel, blur).to(radii.dtype))


def _outside(tiles: Tensor, bins: TileBins, width: int, height: int, monomials: Tensor) -> Tensor:
    """[n, P] pixels of ``tiles`` that lie beyond the image."""
    origin = tile_origins(tiles, bins, monomials.dtype)
    return ((origin[:, None, 0] + monomials[None, :, 1]) > width) | ((origin[:, None, 1] + monomials[None, :, 2]) > height)


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
    low_pass: float = FILTER_INV_SQUARE,  # the screen-space filter: sigma_2d = low_pass |pixel - means2d|^2
) -> dict[str, Tensor]:
    """Composite C views: ``features`` [C, H, W, D] accumulated (no background), ``alpha``, ``median`` and
    ``distortion`` [C, H, W, 1]. ``ray_transforms`` may differ from the projection's by a term of zero value that carries
    a gradient (the densification signal); the bounding boxes and filter centers stay the projection's."""
    C, N = proj.depths.shape
    D = features.shape[-1]
    bins = bin_gaussians(replace(proj, radii=reaching_radii(proj.radii, opacities, low_pass)), width, height, tile_size,
                         chunk_elements)
    T = proj.ray_transforms if ray_transforms is None else ray_transforms

    def flat(t: Tensor) -> Tensor:  # [C, N, ...] -> [C * N + 1, ...], the last row the padding surfel
        t = t.reshape(C * N, *t.shape[2:])
        return torch.cat([t, t.new_zeros((1,) + t.shape[1:])])

    ids = bins.flat_ids
    coefficients = entry_coefficients(plane_coefficients(T).reshape(C * N, 3, 3)[ids], proj.means2d.reshape(C * N, 2)[ids],
                                      tile_origins(bins.tile_of, bins, features.dtype), low_pass)
    coefficients = torch.cat([coefficients, coefficients.new_zeros(1, 4, 6)])  # the padding entry: never hit
    arrays = (coefficients, flat(opacities), flat(features), flat(proj.depths))
    surfel_of = torch.cat([ids, ids.new_full((1,), C * N)])  # list position -> surfel row
    monomials = pixel_features(tile_size, features.dtype, features.device)
    n_tiles, P = C * bins.tiles_x * bins.tiles_y, tile_size * tile_size
    pairs = sum(len(tiles) * K * P for tiles, K in bins.chunks)
    recompute = torch.is_grad_enabled() and pairs > save_elements and any(a.requires_grad for a in arrays)
    parts, done_tiles = [], []
    for tiles, K in bins.chunks:
        entries = tile_lists(bins, tiles, K)
        args = (entries, surfel_of[entries], monomials, _outside(tiles, bins, width, height, monomials),
                bins.counts[tiles], *arrays)
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

"""Hash grid against a naive per-point loop (Instant-NGP's definition), gradients, the frequency encoding."""

import math
import textwrap

import pytest
import torch

from lift3d.fields.encodings import (
    HashGrid,
    HashGridConfig,
    frequency_encode,
    hash_grid_encode,
    hash_grid_layout,
)
from lift3d.fields.hash_reference import HASH_PRIMES
from tests.conftest import run_in_triton_interpreter
from tests.nerf_fields import single_thread  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")


def naive_hash_grid(points, table, layout):
    """One point, one level, one corner at a time with Python integers."""
    out = torch.zeros(points.shape[0], layout.n_levels, layout.n_features, dtype=table.dtype)
    for n, p in enumerate(points.tolist()):
        for level in range(layout.n_levels):
            r = layout.resolutions[level]
            pos = [c * r for c in p]
            cell = [min(max(int(math.floor(c)), 0), r - 1) for c in pos]
            frac = [c - i for c, i in zip(pos, cell, strict=False)]
            for corner in range(8):
                offs = [(corner >> axis) & 1 for axis in range(3)]
                v = [i + o for i, o in zip(cell, offs, strict=False)]
                w = 1.0
                for axis in range(3):
                    w *= frac[axis] if offs[axis] else 1 - frac[axis]
                if layout.dense[level]:
                    row = v[0] + v[1] * (r + 1) + v[2] * (r + 1) ** 2
                else:
                    row = ((v[0] * HASH_PRIMES[0]) ^ (v[1] * HASH_PRIMES[1]) ^ (v[2] * HASH_PRIMES[2])) % layout.hashmap_size
                out[n, level] += w * table[layout.offsets[level] + row]
    return out.reshape(points.shape[0], -1)


def test_layout_follows_instant_ngp_parameters():
    layout = hash_grid_layout(n_levels=16, n_features=2, log2_hashmap_size=19, base_resolution=16, per_level_scale=1.3819128800)
    assert layout.resolutions[0] == 16 and layout.resolutions[-1] == 2048
    assert layout.dense[:5] == (True,) * 5 and not any(layout.dense[5:])  # (res + 1)^3 <= 2^19 only for the coarse ones
    assert all(s == 2**19 for s, d in zip(layout.sizes, layout.dense, strict=False) if not d)
    assert layout.offsets[1] == layout.sizes[0] and layout.output_dim == 32


def test_hash_grid_matches_naive_reference():
    torch.manual_seed(0)
    layout = hash_grid_layout(n_levels=5, n_features=2, log2_hashmap_size=7, base_resolution=2, per_level_scale=1.9)
    assert any(layout.dense) and not all(layout.dense)  # both indexing schemes are exercised
    table = torch.randn(layout.n_rows, 2, dtype=torch.float64)
    points = torch.rand(40, 3, dtype=torch.float64)
    points[0] = torch.tensor([0.0, 1.0, 0.5], dtype=torch.float64)  # faces of the cube
    expected = naive_hash_grid(points, table, layout)
    torch.testing.assert_close(hash_grid_encode(points, table, layout), expected, rtol=1e-12, atol=1e-12)


def test_hash_grid_interpolates_vertex_values_exactly():
    layout = hash_grid_layout(n_levels=1, n_features=1, log2_hashmap_size=10, base_resolution=4, per_level_scale=1.0)
    table = torch.arange(layout.n_rows, dtype=torch.float64)[:, None]
    # at a grid vertex the encoding is that vertex's table entry; the dense row of (i, j, k) is i + 5j + 25k
    vertex = torch.tensor([[1 / 4, 2 / 4, 3 / 4]], dtype=torch.float64)
    assert hash_grid_encode(vertex, table, layout).item() == pytest.approx(1 + 5 * 2 + 25 * 3)
    # the dense table is linear in i, j, k, so trilinear interpolation reproduces it anywhere
    p = torch.tensor([[0.3, 0.55, 0.9]], dtype=torch.float64)
    assert hash_grid_encode(p, table, layout).item() == pytest.approx(4 * (0.3 + 5 * 0.55 + 25 * 0.9))


def test_hash_grid_gradcheck_table_and_points():
    torch.manual_seed(1)
    layout = hash_grid_layout(n_levels=3, n_features=2, log2_hashmap_size=6, base_resolution=2, per_level_scale=2.0)
    table = (torch.randn(layout.n_rows, 2, dtype=torch.float64) * 0.5).requires_grad_(True)
    points = (torch.rand(6, 3, dtype=torch.float64) * 0.8 + 0.1).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t, p: hash_grid_encode(p, t, layout), (table, points), eps=1e-6, atol=1e-6)


def test_progressive_level_masking():
    grid = HashGrid(HashGridConfig(n_levels=4, n_features_per_level=2, log2_hashmap_size=8, base_resolution=2,
                                   per_level_scale=2.0, start_level=1, update_steps=10, init_scale=1.0))
    points = torch.rand(8, 3)
    grid.set_step(0)
    out = grid(points)
    assert out[:, 2:].abs().max() == 0 and out[:, :2].abs().max() > 0
    grid.set_step(25)  # 1 + 25 // 10 = 3 levels
    out = grid(points)
    assert out[:, 6:].abs().max() == 0 and out[:, 4:6].abs().max() > 0
    grid.set_step(1000)
    assert grid(points)[:, 6:].abs().max() > 0


def test_frequency_encoding_matches_loop():
    x = torch.randn(5, 3)
    out = frequency_encode(x, 3)
    expected = [x] + [torch.sin(2**k * math.pi * x) for k in range(3)] + [torch.cos(2**k * math.pi * x) for k in range(3)]
    torch.testing.assert_close(out, torch.cat(expected, -1))


TRITON_CHECK = textwrap.dedent(
    """
    import torch
    from lift3d.fields.encodings import hash_grid_encode, hash_grid_layout
    from lift3d.fields.hash_triton import hash_grid_encode_triton
    torch.manual_seed(0)
    layout = hash_grid_layout(5, 2, 8, 2, 1.9)
    table = torch.randn(layout.n_rows, 2, requires_grad=True)
    points = torch.rand(300, 3)
    fast, ref = hash_grid_encode_triton(points, table, layout), hash_grid_encode(points, table, layout)
    w = torch.randn_like(ref)
    g_fast, = torch.autograd.grad((fast * w).sum(), table)
    g_ref, = torch.autograd.grad((ref * w).sum(), table)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g_fast, g_ref, atol=1e-4, rtol=1e-4)
    # clustered points, as a renderer makes them: runs along rays that share rows (summed before the atomics),
    # exact repeats, a run across a block boundary (128) and a length that is not a multiple of the block
    t = torch.linspace(0, 1, 90)[:, None]
    ray_a = torch.tensor([0.1, 0.2, 0.3]) + t * torch.tensor([0.5, 0.1, 0.0])
    ray_b = torch.tensor([0.9, 0.5, 0.2]) - t * torch.tensor([0.0, 0.3, 0.6])
    points = torch.cat([ray_a, torch.full((50, 3), 0.42), ray_b, torch.rand(31, 3)])
    fast, ref = hash_grid_encode_triton(points, table, layout), hash_grid_encode(points, table, layout)
    w = torch.randn_like(ref)
    g_fast, = torch.autograd.grad((fast * w).sum(), table)
    g_ref, = torch.autograd.grad((ref * w).sum(), table)
    torch.testing.assert_close(g_fast, g_ref, atol=1e-4, rtol=1e-4)
    # blocks of rows whose gradient is all zero (a sample budget's padding) add nothing and are skipped
    w[128:384] = 0
    g_fast, = torch.autograd.grad((hash_grid_encode_triton(points, table, layout) * w).sum(), table)
    g_ref, = torch.autograd.grad((hash_grid_encode(points, table, layout) * w).sum(), table)
    torch.testing.assert_close(g_fast, g_ref, atol=1e-4, rtol=1e-4)
    w[200, 0] = float("nan")  # but a NaN among zeros is not dropped: it reaches the table as it would through PyTorch
    g_nan, = torch.autograd.grad((hash_grid_encode_triton(points, table, layout) * w).sum(), table)
    assert g_nan.isnan().any()
    reference = torch.autograd.grad((hash_grid_encode(points, table, layout) * w).sum(), table)[0]
    torch.testing.assert_close(g_nan.isnan(), reference.isnan())
    w[200, 0] = 0.0
    # other launch settings give the same values and gradients
    import lift3d.fields.hash_triton as ht
    ht.LAUNCH = {"forward": (64, 2), "backward": (256, 8)}
    other, = torch.autograd.grad((hash_grid_encode_triton(points, table, layout) * w).sum(), table)
    torch.testing.assert_close(other, g_fast, atol=1e-6, rtol=1e-6)
    # the self-check passes also when first called from no-grad or inference-mode code
    from lift3d.fields.hash_triton import self_check
    with torch.no_grad():
        assert self_check(table, layout, strict=True, n_points=64)
    with torch.inference_mode():
        assert self_check(table, layout, strict=True, n_points=64)
    print("ok")
    """
)


def test_triton_kernel_matches_torch_in_interpreter():
    run_in_triton_interpreter(TRITON_CHECK, "the Triton kernel")


@pytest.mark.gpu
def test_triton_kernel_matches_torch_on_cuda():
    from lift3d.fields.hash_triton import self_check

    layout = hash_grid_layout(16, 2, 19, 16, 1.3819128800)
    table = torch.empty(layout.n_rows, 2, device="cuda").uniform_(-1, 1)
    assert self_check(table, layout, strict=True, n_points=65536)


@pytest.mark.gpu
def test_triton_features_are_half_under_autocast_with_the_float32_values_and_gradients():
    """Under CUDA autocast the lookup writes half features (what the MLP casts them to anyway) and takes half
    gradients: the same numbers as the float32 lookup followed by the casts."""
    from lift3d.fields.hash_triton import hash_grid_encode_triton

    layout = hash_grid_layout(16, 2, 19, 16, 1.4472692374)
    table = torch.empty(layout.n_rows, 2, device="cuda").uniform_(-1, 1).requires_grad_(True)
    points = torch.rand(50000, 3, device="cuda")
    upstream = torch.randn(50000, layout.output_dim, device="cuda").half()
    reference = hash_grid_encode_triton(points, table, layout)
    assert reference.dtype == torch.float32
    (grad_reference,) = torch.autograd.grad((reference.half().float() * upstream.float()).sum(), table)
    with torch.autocast("cuda", dtype=torch.float16):
        half = hash_grid_encode_triton(points, table, layout)
    assert half.dtype == torch.float16
    assert torch.equal(half, reference.half())
    (grad_half,) = torch.autograd.grad(half, table, grad_outputs=upstream)
    assert grad_half.dtype == torch.float32
    torch.testing.assert_close(grad_half, grad_reference, atol=1e-5, rtol=1e-5)


REUSE_CHECK = textwrap.dedent(
    """
    import torch
    import lift3d.fields.hash_triton as ht
    from lift3d.fields.encodings import HashGrid
    from lift3d.registry import find
    from tests.render.volume.test_rendering import _rays, make_renderer
    torch.manual_seed(0)
    # the Triton function given its own output back: the same values, the same table gradient, no lookup
    from lift3d.fields.encodings import hash_grid_layout
    layout = hash_grid_layout(4, 2, 8, 2, 1.9)
    table = torch.randn(layout.n_rows, 2, requires_grad=True)
    points = torch.rand(130, 3)
    with torch.no_grad():
        kept = ht.hash_grid_encode_triton(points, table, layout)
    lookups = []
    kernel = ht._hash_forward_kernel
    class Counting:
        def __getitem__(self, grid):
            lookups.append(grid)
            return kernel[grid]
    ht._hash_forward_kernel = Counting()
    fresh = ht.hash_grid_encode_triton(points, table, layout)
    reused = ht.hash_grid_encode_triton(points, table, layout, kept)
    assert len(lookups) == 1 and torch.equal(reused, fresh)
    w = torch.randn_like(fresh)
    g_fresh, = torch.autograd.grad((fresh * w).sum(), table)
    g_reused, = torch.autograd.grad((reused * w).sum(), table)
    assert torch.equal(g_reused, g_fresh)
    try:
        ht.hash_grid_encode_triton(points, table, layout, kept[:10])
        raise AssertionError("a wrong shape was accepted")
    except ValueError as error:
        assert "features to reuse must be [130, 8]" in str(error)
    ht._hash_forward_kernel = kernel
    # a training render whose field takes the Triton path (as on CUDA): the full pass reuses the density pass's
    # features and gets the same render and gradients as looking them up again
    HashGrid._use_triton = lambda self, points: not points.requires_grad
    field = find("implicit-volume")({"radius": 1.0, "density_bias": 1.0,
                                     "encoding": {"n_levels": 4, "log2_hashmap_size": 10, "base_resolution": 4}})
    o, d = _rays(12)
    results = []
    for reuse in ("auto", "never"):
        renderer = make_renderer(field, steps_per_diagonal=24, march_segment=0, randomized=False,
                                 reuse_encoding=reuse, occupancy={"resolution": 8}).train()
        field.zero_grad()
        calls = []
        real = ht.hash_grid_encode_triton
        ht.hash_grid_encode_triton = lambda p, t, lay, r=None: calls.append(r is not None) or real(p, t, lay, r)
        out = renderer.render_rays(o, d)
        ht.hash_grid_encode_triton = real
        assert calls == ([False, True] if reuse == "auto" else [False, False]), calls
        out["rgb"].sum().backward()
        results.append((out["rgb"].detach(), field.encoding.table.grad.clone(), field.mlp.layers[0].weight.grad.clone()))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    assert results[0][1].abs().sum() > 0
    print("ok")
    """
)


def test_triton_lookup_reuses_given_features_with_the_same_gradients_in_interpreter():
    run_in_triton_interpreter(REUSE_CHECK, "the Triton kernel")

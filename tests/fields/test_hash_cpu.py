"""The blocked CPU hash-grid lookup gives the reference's numbers bit for bit, and HashGrid uses it on CPU."""

import pytest
import torch

from lift3d.fields.encodings import HashGrid, HashGridConfig, hash_grid_encode, hash_grid_layout
from lift3d.fields.hash_cpu import hash_grid_encode_cpu

LAYOUTS = [
    dict(n_levels=8, n_features=2, log2_hashmap_size=15, base_resolution=16, per_level_scale=1.4859943),  # the CPU recipe
    dict(n_levels=3, n_features=4, log2_hashmap_size=12, base_resolution=4, per_level_scale=2.0),  # dense and hashed, F = 4
    dict(n_levels=2, n_features=2, log2_hashmap_size=19, base_resolution=4, per_level_scale=1.5),  # every level dense
    dict(n_levels=2, n_features=1, log2_hashmap_size=8, base_resolution=32, per_level_scale=2.0),  # every level hashed
]


@pytest.mark.parametrize("params", LAYOUTS)
@pytest.mark.parametrize("chunk", [7, 8192])
def test_values_and_table_gradient_are_bit_identical(params, chunk):
    layout = hash_grid_layout(**params)
    generator = torch.Generator().manual_seed(0)
    table = torch.randn(layout.n_rows, layout.n_features, generator=generator).requires_grad_(True)
    points = torch.rand(300, 3, generator=generator)
    points[0], points[1], points[2] = 0.0, 1.0, torch.tensor([0.5, 1.0, 0.0])  # box faces: clamped cells
    upstream = torch.randn(300, layout.output_dim, generator=generator)
    reference = hash_grid_encode(points, table, layout)
    fast = hash_grid_encode_cpu(points, table, layout, chunk=chunk)
    assert torch.equal(fast, reference)
    (g_ref,) = torch.autograd.grad((reference * upstream).sum(), table)
    (g_fast,) = torch.autograd.grad((fast * upstream).sum(), table)
    assert torch.equal(g_fast, g_ref)
    with torch.no_grad():
        assert torch.equal(hash_grid_encode_cpu(points, table, layout, chunk=chunk), reference)


def test_empty_input_and_point_gradients():
    layout = hash_grid_layout(**LAYOUTS[1])
    table = torch.randn(layout.n_rows, layout.n_features)
    assert hash_grid_encode_cpu(torch.zeros(0, 3), table, layout).shape == (0, layout.output_dim)
    with pytest.raises(ValueError, match="no gradient for the points"):
        hash_grid_encode_cpu(torch.rand(4, 3, requires_grad=True), table, layout)


def test_hash_grid_module_picks_the_blocked_path_on_cpu(monkeypatch):
    import lift3d.fields.hash_cpu as hash_cpu

    calls = []
    original = hash_cpu.hash_grid_encode_cpu
    monkeypatch.setattr(hash_cpu, "hash_grid_encode_cpu", lambda *a, **k: calls.append(1) or original(*a, **k))
    grid = HashGrid(HashGridConfig(n_levels=4, log2_hashmap_size=12))
    reference = HashGrid(HashGridConfig(n_levels=4, log2_hashmap_size=12, backend="torch"))
    reference.load_state_dict(grid.state_dict())
    points = torch.rand(64, 3)
    assert torch.equal(grid(points), reference(points)) and calls == [1]
    # points that need a gradient (analytic normals) take the reference path
    probe = points.clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(grid(probe).sum(), probe)
    assert gradient.abs().sum() > 0 and calls == [1]

"""The implicit volume field: activations, density blob, normals, chunked queries, config errors."""

import pytest
import torch
import torch.nn.functional as F

from lift3d.config import ConfigError
from lift3d.fields.mlp import trunc_exp
from lift3d.registry import find
from tests.nerf_fields import single_thread  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = {"encoding": {"n_levels": 2, "log2_hashmap_size": 8, "base_resolution": 4}, "hidden_dim": 8}


class SphereField(find("implicit-volume")):
    """The real field with an analytic raw density (a smooth ball of radius 0.5) to check normals."""

    def raw(self, points):  # the old signature: forward still calls it so
        raw = 10.0 * (0.5 - points.norm(dim=-1))
        return raw, points.new_zeros(points.shape[0], self.cfg.n_feature_dims)


@pytest.mark.parametrize("normal_type", ["finite_difference", "analytic"])
def test_normals_point_outwards(normal_type):
    field = SphereField({**TINY, "normal_type": normal_type, "finite_difference_eps": 1e-3})
    points = F.normalize(torch.randn(20, 3), dim=-1) * 0.4
    out = field(points, with_normal=True)
    torch.testing.assert_close(out["normal"], F.normalize(points, dim=-1), atol=1e-3, rtol=0)


def test_analytic_normals_keep_the_graph_for_losses():
    field = find("implicit-volume")({**TINY, "normal_type": "analytic"})
    points = torch.rand(16, 3) - 0.5
    out = field(points, with_normal=True)
    out["normal"][:, 2].sum().backward()  # e.g. an orientation loss: second derivatives reach the table
    assert field.encoding.table.grad.abs().sum() > 0


def test_density_blob_and_activation():
    field = find("implicit-volume")({**TINY, "density_blob": "gaussian", "blob_density": 5.0, "blob_radius": 0.5,
                                     "density_bias": -1.0, "density_activation": "softplus"})
    for p in field.mlp.parameters():
        torch.nn.init.zeros_(p)
    points = torch.tensor([[0.0, 0.0, 0.0], [0.3, 0.4, 0.0]])
    expected = F.softplus(-1.0 + 5.0 * torch.exp(-(points**2).sum(-1) / (2 * 0.25)))
    torch.testing.assert_close(field.density(points), expected)
    linear = find("implicit-volume")({**TINY, "density_blob": "linear", "blob_density": 2.0, "blob_radius": 1.0,
                                      "density_activation": "exp"})
    for p in linear.mlp.parameters():
        torch.nn.init.zeros_(p)
    torch.testing.assert_close(linear.density(points), torch.exp(2.0 * (1 - points.norm(dim=-1))))


def test_chunked_queries_match_one_call():
    field = find("implicit-volume")({**TINY, "query_chunk": 7, "n_feature_dims": 5})
    points = torch.rand(50, 3) * 2 - 1
    whole = field(points)
    torch.testing.assert_close(field.density(points), whole["density"])
    torch.testing.assert_close(field.features(points), whole["features"])
    assert field.features(points).shape == (50, 5)
    torch.testing.assert_close(field.bbox, torch.tensor([[-1.0] * 3, [1.0] * 3]))
    grads = []
    for query in (field.density, lambda p: field(p)["density"]):  # pieces written into one output keep their graph
        field.zero_grad()
        query(points).square().sum().backward()
        grads.append(field.encoding.table.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_trunc_exp_gradient_is_bounded():
    x = torch.tensor([0.0, 50.0], requires_grad=True)
    trunc_exp(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([1.0, torch.exp(torch.tensor(15.0)).item()]))


def test_trunc_exp_is_finite_where_exp_overflows():
    # a refinement that drove a triplane's raw density past 88.7 left inf densities that meshing rejected
    x = torch.tensor([10.0, 100.0, 1e4])
    y = trunc_exp(x)
    assert torch.isfinite(y).all() and y[0] == torch.exp(torch.tensor(10.0)) and y[1] == y[2] > 1e38


def test_bad_configs_are_clear():
    with pytest.raises(ValueError, match="density_activation"):
        find("implicit-volume")({"density_activation": "cube"})
    with pytest.raises(ConfigError, match="n_level"):
        find("implicit-volume")({"encoding": {"n_level": 3}})
    with pytest.raises(ValueError, match="backend"):
        find("implicit-volume")({"encoding": {"backend": "cuda"}})


def test_training_works_after_an_inference_mode_render():
    # evaluation (Lightning runs it in inference mode) must leave nothing behind that breaks autograd later
    layout = {"n_levels": 3, "log2_hashmap_size": 9, "base_resolution": 3}  # used by no other test: nothing cached yet
    field = find("implicit-volume")({**TINY, "encoding": layout, "normal_type": "analytic"})
    points = torch.rand(16, 3) - 0.5
    with torch.inference_mode():
        field(points, with_normal=True)
    out = field(points, with_normal=True)
    (out["density"].sum() + out["normal"].sum()).backward()
    assert field.encoding.table.grad.abs().sum() > 0


def test_a_reused_encoding_gives_the_fields_values_and_gradients():
    """``forward(points, encoding=)`` with ``density_and_encoding``'s features: the same density and features (taken
    as they are without a table gradient to compute; looked up again on the CPU's training path), and with levels
    masked for coarse-to-fine the features it hands back are the unmasked ones."""
    torch.manual_seed(0)
    field = find("implicit-volume")({**TINY, "encoding": {**TINY["encoding"], "start_level": 1}, "query_chunk": 7})
    points = torch.rand(40, 3) * 2 - 1
    with torch.no_grad():
        density, encoding = field.density_and_encoding(points)
        assert encoding.shape == (40, field.encoding.output_dim) and (encoding[:, 2:] != 0).any()  # unmasked
        reused = field(points, encoding=encoding)
        fresh = field(points)
    torch.testing.assert_close(density, fresh["density"], atol=0, rtol=0)
    for key in ("density", "features"):
        torch.testing.assert_close(reused[key], fresh[key], atol=0, rtol=0)
    grads = []
    for kwargs in ({}, {"encoding": encoding}):
        field.zero_grad()
        out = field(points, **kwargs)
        (out["density"].sum() + out["features"].sum()).backward()
        grads.append(field.encoding.table.grad.clone())
    torch.testing.assert_close(grads[1], grads[0], atol=0, rtol=0)


def test_fused_linear_relu_has_linear_then_relus_values_and_gradients():
    """The fused GEMM + ReLU (CUDA's path) against nn.Linear then ReLU, on the CPU where ``_addmm_activation`` runs
    too; a unit whose pre-activation is exactly zero passes no gradient, as ReLU's does not."""
    from lift3d.fields.mlp import _LinearReLU

    torch.manual_seed(0)
    layer = torch.nn.Linear(6, 5)
    x = torch.randn(30, 6, requires_grad=True)
    reference = F.relu(layer(x))
    g = torch.randn_like(reference)
    expected = torch.autograd.grad((reference * g).sum(), (x, layer.weight, layer.bias))
    fused = _LinearReLU.apply(x, layer.weight, layer.bias)
    got = torch.autograd.grad((fused * g).sum(), (x, layer.weight, layer.bias))
    torch.testing.assert_close(fused, reference)
    for a, b in zip(got, expected, strict=False):
        torch.testing.assert_close(a, b)
    assert (reference == 0).any() and (reference > 0).any()

"""Fused segment marching (renderer.fuse_field_pass): the segment pass evaluates the whole field once and keeps
its outputs, so the renderer needs no second field pass; same samples, images and gradients as two passes."""

import pytest
import torch

from lift3d.registry import find
from tests.nerf_fields import single_thread  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")


def _field():
    torch.manual_seed(0)
    field = find("implicit-volume")({"radius": 1.0, "n_feature_dims": 3, "density_bias": 2.0,
                                     "encoding": {"n_levels": 4, "log2_hashmap_size": 12, "init_scale": 0.5}})
    return field


def _render(field, fuse, training, calls, compute_normals=False):
    material = find("emission")({})
    background = find("solid-color")({"color": [1.0, 1.0, 1.0]})
    renderer = find("volume-renderer")({"steps_per_diagonal": 128, "march_segment": 16, "early_stop_eps": 1e-2,
                                        "fuse_field_pass": fuse}, field, material, background)
    renderer.train(training)
    renderer.occupancy.mark_all()
    generator = torch.Generator().manual_seed(1)
    o = torch.tensor([0.0, 0.0, 3.0]).expand(96, 3) + 0.3 * torch.randn(96, 3, generator=generator)
    d = torch.nn.functional.normalize(torch.tensor([0.0, 0.0, -1.0]) + 0.2 * torch.randn(96, 3, generator=generator), dim=-1)
    forward, density = field.forward, field.density
    field.forward = lambda p, **k: calls.append(("field", p.shape[0])) or forward(p, **k)
    field.density = lambda p: calls.append(("density", p.shape[0])) or density(p)
    try:
        torch.manual_seed(2)  # the training jitter
        return renderer.render_rays(o, d, compute_normals=compute_normals)
    finally:
        del field.forward, field.density


@pytest.mark.parametrize("training", [True, False])
def test_fused_pass_gives_the_two_pass_samples_images_and_gradients(training):
    field = _field()
    out, grads, calls = {}, {}, {}
    for fuse in ("never", "auto"):
        calls[fuse] = []
        with torch.set_grad_enabled(training):
            out[fuse] = _render(field, fuse, training, calls[fuse])
        if training:
            field.zero_grad()
            (out[fuse]["rgb"].square().sum() + out[fuse]["depth"].sum()).backward()
            grads[fuse] = [p.grad.clone() for p in field.parameters()]
    assert out["auto"]["num_samples"] == out["never"]["num_samples"]
    assert out["never"]["num_samples"] < 0.8 * sum(n for kind, n in calls["never"] if kind == "density")  # rays stop early
    torch.testing.assert_close(out["auto"]["ray_indices"], out["never"]["ray_indices"], rtol=0, atol=0)
    torch.testing.assert_close(out["auto"]["sample_t"], out["never"]["sample_t"], rtol=0, atol=0)
    for key in ("rgb", "alpha", "depth"):
        torch.testing.assert_close(out["auto"][key], out["never"][key], atol=1e-6, rtol=1e-5)
    for fused, plain in zip(grads.get("auto", []), grads.get("never", []), strict=False):
        torch.testing.assert_close(fused, plain, atol=1e-6, rtol=1e-4)
    # two passes: densities of the candidates, then the field at the kept samples; fused: the field once per segment
    assert [kind for kind, _ in calls["never"]][-1] == "field"
    assert sum(n for k, n in calls["never"] if k == "field") == out["never"]["num_samples"]
    assert {kind for kind, _ in calls["auto"]} == {"field"}
    assert sum(n for _, n in calls["auto"]) == sum(n for kind, n in calls["never"] if kind == "density")


def test_normals_keep_the_second_pass():
    calls = []
    with torch.no_grad():
        out = _render(_field(), "auto", False, calls, compute_normals=True)
    assert "normal" in out and calls[-1] == ("field", int(out["num_samples"]))
    assert {kind for kind, _ in calls[:-1]} == {"density"}


def test_fuse_mode_is_checked():
    with pytest.raises(ValueError, match="fuse_field_pass"):
        find("volume-renderer")({"fuse_field_pass": "always"}, _field(), find("emission")({}), find("solid-color")({}))

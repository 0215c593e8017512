"""The gsplat backend's plumbing, on the CPU with a stand-in for ``gsplat.rasterization_2dgs``: each view's
densification gradient (gsplat's ``gradient_2dgs``, filled only by the backward pass) reaches the returned
``densify_grad`` of a several-view call. The numerics against gsplat itself are the GPU parity tests'."""

from __future__ import annotations

import sys
import types

import torch

from lift3d.render.surfels.gsplat_backend import rasterize_surfels_gsplat


def _stand_in(means, quats, scales, opacities, colors, viewmats, Ks, width, height, **options):
    """Outputs shaped as gsplat's, whose red channel holds sum(weight * gradient_2dgs) with a weight per view."""
    n = means.shape[0]
    densify = torch.zeros(1, n, 2, requires_grad=True)
    weight = viewmats[0, 0, 3] + torch.arange(2 * n, dtype=torch.float32).reshape(1, n, 2)  # differs per view
    red = (densify * weight).sum() + means.sum() * 0
    render = torch.zeros(1, height, width, 4) + torch.stack([red, red * 0, red * 0, red * 0])
    ones = torch.ones(1, height, width, 1)
    meta = {"means2d": torch.zeros(1, n, 2), "gradient_2dgs": densify, "radii": torch.ones(1, n, 2, dtype=torch.int32),
            "depths": torch.ones(1, n)}
    return render, ones, torch.zeros(1, height, width, 3), None, ones * 0, ones, meta


def test_each_views_densification_gradient_reaches_the_output(monkeypatch):
    monkeypatch.setitem(sys.modules, "gsplat", types.SimpleNamespace(rasterization_2dgs=_stand_in))
    n, views, width, height = 5, 3, 4, 2
    viewmats = torch.eye(4).repeat(views, 1, 1)
    viewmats[:, 0, 3] = torch.tensor([1.0, 10.0, 100.0])
    means = torch.zeros(n, 3, requires_grad=True)
    out = rasterize_surfels_gsplat(means, torch.zeros(n, 4), torch.ones(n, 2), torch.ones(n), torch.ones(n, 3), viewmats,
                                   torch.eye(3).repeat(views, 1, 1), width, height, torch.zeros(views, 3))
    assert out["densify_grad"].shape == (views, n, 2) and not out["densify_grad"].any()  # before the backward pass
    out["render"][..., 0].sum().backward()
    for c in range(views):
        weight = viewmats[c, 0, 3] + torch.arange(2 * n, dtype=torch.float32).reshape(n, 2)
        torch.testing.assert_close(out["densify_grad"][c], weight * width * height)

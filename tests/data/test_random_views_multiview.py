"""Random views for multi-view guidance (MVDream): groups of 4 views of one object, 90 degrees apart in
azimuth from a random base, sharing elevation, distance and field of view."""

from __future__ import annotations

import math

import pytest
import torch

from lift3d.cameras import c2w_to_spherical, fov_from_focal
from lift3d.data.random_views import RandomViewsConfig, RandomViewsDataModule, sample_random_views
from lift3d.rng import step_generator


def four_view_config(**overrides) -> RandomViewsConfig:
    return RandomViewsConfig(height=8, width=8, batch_size=12, n_views=4, camera_perturb=0.0, center_perturb=0.0,
                             up_perturb=0.0, **overrides)


def test_batches_are_objects_of_four_views_90_degrees_apart():
    batch = sample_random_views(four_view_config(), 0, step_generator(3, 0))
    cameras = batch["cameras"]
    assert len(cameras) == 12
    # measured from the cameras themselves, not the returned angles
    elevation, azimuth, distance = (v.reshape(3, 4) for v in c2w_to_spherical(cameras.c2w))
    fovy = fov_from_focal(cameras.intrinsics[:, 1, 1], cameras.height).reshape(3, 4)
    for shared in (elevation, distance, fovy, batch["elevation_deg"].reshape(3, 4), batch["fovy_deg"].reshape(3, 4)):
        torch.testing.assert_close(shared, shared[:, :1].expand(-1, 4))
    steps = torch.rad2deg(azimuth.diff(dim=1))
    torch.testing.assert_close(torch.remainder(steps, 360.0), torch.full_like(steps, 90.0), atol=1e-3, rtol=0)
    torch.testing.assert_close(torch.deg2rad(batch["azimuth_deg"]).reshape(3, 4), azimuth, atol=1e-5, rtol=0)
    # the 4 positions of an object are one another turned by 90 degrees about +z
    positions = cameras.positions.reshape(3, 4, 3)
    turn = torch.tensor([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    torch.testing.assert_close(positions[:, 1:], positions[:, :-1] @ turn.T, atol=1e-5, rtol=0)
    # objects differ; each camera looks at the origin
    assert elevation[:, 0].unique().numel() == 3 and azimuth[:, 0].unique().numel() == 3
    forward = -cameras.c2w[:, :3, 2]
    torch.testing.assert_close(forward, -cameras.positions / cameras.positions.norm(dim=-1, keepdim=True), atol=1e-5, rtol=0)


def test_random_base_azimuth_covers_the_circle():
    bases = torch.cat([sample_random_views(four_view_config(), s, step_generator(0, s))["azimuth_deg"][::4] for s in range(50)])
    assert bases.min() < -150 and bases.max() > 150 and bases.std() > 60


def test_perturbations_are_shared_by_an_object_and_relative_distance_fills_the_view():
    cfg = four_view_config(camera_distance_range=[0.8, 1.0], relative_distance=True, fovy_range=[15.0, 60.0])
    cfg.center_perturb = 0.3
    batch = sample_random_views(cfg, 0, step_generator(1, 0))
    ratio = batch["distance"] * torch.tan(torch.deg2rad(batch["fovy_deg"]) / 2)  # distance / (1 / tan(fovy / 2))
    assert ((ratio >= 0.8 - 1e-5) & (ratio <= 1.0 + 1e-5)).all()
    # the shared look-at target: every view's optical axis passes through the same point
    cameras = batch["cameras"]
    origins, dirs = cameras.positions.reshape(3, 4, 3), -cameras.c2w[:, :3, 2].reshape(3, 4, 3)
    for b in range(3):  # least-squares point nearest to the 4 axes lies on every one of them
        projector = torch.eye(3) - dirs[b][:, :, None] * dirs[b][:, None, :]
        point = torch.linalg.solve(projector.sum(0), (projector @ origins[b][:, :, None]).sum(0))[:, 0]
        offsets = point - origins[b]
        distance_to_axis = (offsets - (offsets * dirs[b]).sum(-1, keepdim=True) * dirs[b]).norm(dim=-1)
        assert distance_to_axis.max() < 1e-4 and point.norm() > 1e-3


def test_single_views_keep_the_plain_sampler_and_bad_batches_say_what_to_fix():
    plain = sample_random_views(RandomViewsConfig(batch_size=4), 5, step_generator(2, 5))
    explicit = sample_random_views(RandomViewsConfig(batch_size=4, n_views=1), 5, step_generator(2, 5))
    assert torch.equal(plain["cameras"].c2w, explicit["cameras"].c2w)
    quarters = ((plain["azimuth_deg"] + 180) // 90).long().sort().values
    assert torch.equal(quarters, torch.arange(4)) and not math.isclose(float(plain["azimuth_deg"].diff()[0]), 90.0)
    with pytest.raises(ValueError, match=r"data.batch_size \(\[8, 6\]\) must be a multiple of data.n_views \(4\)"):
        RandomViewsDataModule({"batch_size": [8, 6], "n_views": 4, "height": [8, 8], "width": [8, 8],
                               "resolution_milestones": [5]})
    with pytest.raises(ValueError, match="multiple of data.n_views"):
        sample_random_views(RandomViewsConfig(batch_size=6, n_views=4), 0, step_generator(0, 0))


def test_random_backgrounds_are_shared_by_the_views_of_an_object():
    from lift3d.render.backgrounds import NeuralEnvironmentBackground, random_color_augment

    torch.manual_seed(0)
    colors = torch.zeros(64, 2, 2, 3)
    grouped = random_color_augment(colors, 0.5, group=4).reshape(16, 4, 2, 2, 3)
    assert torch.equal(grouped, grouped[:, :1].expand_as(grouped))  # one draw per object
    replaced = grouped.flatten(1).abs().sum(1) > 0
    assert 0 < replaced.sum() < 16  # some objects replaced, some kept
    single = random_color_augment(colors, 0.5).reshape(16, 4, 2, 2, 3)
    assert not torch.equal(single, single[:, :1].expand_as(single))  # per view by default
    background = NeuralEnvironmentBackground({"random_probability": 1.0, "random_group": 4}).train()
    out = background(torch.randn(8, 3, 3, 3)).reshape(2, 4, 3, 3, 3)
    assert torch.equal(out, out[:, :1].expand_as(out))

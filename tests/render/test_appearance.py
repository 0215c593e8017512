"""Per-photo appearance (lift3d.render.appearance, lift3d.systems.appearance): the affine color math, the
held-out scoring protocol, when it is on, its state, and a tiny stand-in reconstruction that it rescues."""

from __future__ import annotations

import pytest
import torch

from lift3d.cameras import Cameras
from lift3d.config import ConfigError
from lift3d.data.summary import SceneSummary
from lift3d.render.appearance import (
    PhotoAppearance,
    apply_affine,
    clip_straight_through,
    fit_affine,
    held_out_scores,
    identity_affine,
    resolve_enabled,
)
from lift3d.systems.appearance import AppearanceHooks


def _random_affine(generator: torch.Generator, n: int = 1) -> torch.Tensor:
    return identity_affine(n) + 0.2 * torch.randn(n, 3, 4, generator=generator)


def test_apply_affine_on_images_and_rays():
    g = torch.Generator().manual_seed(0)
    images, rays = torch.rand(2, 5, 6, 3, generator=g), torch.rand(7, 3, generator=g)
    assert torch.equal(apply_affine(images, identity_affine(2)), images)
    affine = _random_affine(g, 2)
    expected = torch.einsum("bij,bhwj->bhwi", affine[:, :, :3], images) + affine[:, None, None, :, 3]
    assert torch.allclose(apply_affine(images, affine), expected, atol=1e-6)
    per_ray = _random_affine(g, 7)
    expected = (per_ray[:, :, :3] @ rays[:, :, None])[..., 0] + per_ray[:, :, 3]
    assert torch.allclose(apply_affine(rays, per_ray), expected, atol=1e-6)


def test_straight_through_clip_keeps_a_gradient_above_one():
    x = torch.tensor([1.4, 0.5, -0.2], requires_grad=True)
    y = clip_straight_through(x)
    assert torch.equal(y.detach(), torch.tensor([1.0, 0.5, 0.0]))
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(3))


def test_fit_affine_recovers_a_transform():
    g = torch.Generator().manual_seed(1)
    colors = torch.rand(500, 3, generator=g)
    affine = _random_affine(g)[0]
    fitted = fit_affine(colors, colors @ affine[:, :3].T + affine[:, 3], ridge=1e-6)
    assert torch.allclose(fitted, affine, atol=1e-4)
    flat = torch.full((50, 3), 0.5)  # one color: ill-posed, the ridge keeps it near the identity
    assert torch.isfinite(fit_affine(flat, flat * 0.8)).all()


def test_left_half_protocol_fits_on_the_left_and_scores_the_right():
    g = torch.Generator().manual_seed(2)
    render = torch.rand(2, 16, 20, 3, generator=g) * 0.6 + 0.2
    left = torch.tensor([[0.9, 0.05, 0.0, 0.05], [0.0, 0.8, 0.1, 0.0], [0.0, 0.0, 1.1, -0.1]])  # keeps colors in 0..1
    right = _random_affine(g)[0]
    photo = apply_affine(render, left.expand(2, 3, 4))
    scores = held_out_scores(render, photo, "left-half", ridge=1e-6)
    assert scores.shape == (2, 2) and (scores[:, 0] > 60).all() and (scores[:, 1] > 0.999).all()
    # a photo whose right half has another look: the fit never saw it, so the right half scores badly
    photo[:, :, 10:] = apply_affine(render[:, :, 10:], right.expand(2, 3, 4)).clamp(0, 1)
    assert (held_out_scores(render, photo, "left-half", ridge=1e-6)[:, 0] < 30).all()
    # ... and a left half that differs does not change what is scored beyond the fit
    plain = held_out_scores(render, render, "mean")
    assert torch.allclose(plain, torch.tensor([[100.0, 1.0]] * 2), atol=1e-3)
    with pytest.raises(ValueError, match="appearance.eval"):
        held_out_scores(render, photo, "best")


def test_left_half_protocol_splits_each_photo_at_the_middle_of_its_own_pixels():
    """A photo padded on the right (a mixed-size batch) is split at the middle of its own columns, and only its own
    pixels are fitted and scored."""
    g = torch.Generator().manual_seed(4)
    render = torch.rand(1, 8, 20, 3, generator=g) * 0.6 + 0.2
    photo = render * torch.tensor([0.8, 0.9, 1.1])
    mask = torch.zeros(1, 8, 20, 1)
    mask[:, :, :12] = 1  # the photo is 12 columns wide; the rest is padding
    photo[:, :, 6:12] = render[:, :, 6:12]  # its right half (columns 6..11) has another look than its left
    photo[:, :, 12:] = 0.0  # padding: never fitted nor scored
    masked = held_out_scores(render, photo, "left-half", ridge=1e-6, mask=mask)
    whole = held_out_scores(render, photo, "left-half", ridge=1e-6)  # without the mask the split is at column 10
    assert masked[0, 0] < 35 and whole[0, 0] < masked[0, 0]
    photo[:, :, 6:12] = render[:, :, 6:12] * torch.tensor([0.8, 0.9, 1.1])
    assert held_out_scores(render, photo, "left-half", ridge=1e-6, mask=mask)[0, 0] > 60


def test_enabled_auto_is_on_for_real_captures_only():
    for fmt in ("colmap", "nerfstudio", "instant-ngp"):
        assert resolve_enabled("auto", fmt)
    assert not resolve_enabled("auto", "blender") and not resolve_enabled("auto", None)
    assert resolve_enabled(True, "blender") and resolve_enabled("True", None) is True
    assert not resolve_enabled(False, "colmap")
    with pytest.raises(ValueError, match="auto, true or false"):
        resolve_enabled("sometimes", "colmap")


def test_photo_appearance_state():
    assert not PhotoAppearance({}).setup_for("colmap", 10)  # off unless a recipe asks (editing, generation)
    appearance = PhotoAppearance({"enabled": "auto"})
    assert not appearance.active and not list(p for p in appearance.parameters() if p.numel())
    rgb = torch.rand(2, 4, 4, 3)
    assert appearance(rgb, torch.tensor([0, 1])) is rgb
    assert not appearance.setup_for("blender", 10) and not appearance.active
    assert appearance.setup_for("colmap", 10) and appearance.delta.shape == (10, 3, 4)
    assert torch.equal(appearance(rgb, torch.tensor([3, 7])), rgb)  # the identity at first
    with torch.no_grad():
        appearance.delta[3] += 0.3
    index = torch.arange(10)
    assert torch.allclose(appearance.affines(index).mean(0), identity_affine(1)[0], atol=1e-6)  # centered
    out = appearance(rgb, torch.tensor([3, 7]))
    out.sum().backward()
    assert appearance.delta.grad is not None and appearance.delta.grad.abs().sum() > 0
    # a checkpoint's transforms load into a fresh, unsized one (evaluation or export without set-up)
    fresh = PhotoAppearance({"enabled": "false"})
    fresh.load_state_dict(appearance.state_dict())
    assert fresh.active and torch.equal(fresh.delta, appearance.delta)
    fresh.load_state_dict({})  # a checkpoint from before appearance existed
    assert not fresh.active
    with pytest.raises(ConfigError, match="eval must be one of left-half, mean; got 'whole'"):
        PhotoAppearance({"eval": "whole"})
    with pytest.raises((ValueError, ConfigError)):
        PhotoAppearance({"enabled": "maybe"})


def _stand_in_fit(photos: torch.Tensor, appearance: PhotoAppearance | None, steps: int = 300) -> torch.Tensor:
    """A stand-in reconstruction: one learnable image seen by every photo (a scene every camera sees the same),
    fitted with Adam to the photos through the appearance transforms, as a system would."""
    scene = torch.nn.Parameter(torch.full(photos.shape[1:], 0.5))
    groups = [{"params": [scene], "lr": 0.02}]
    if appearance is not None:
        groups.append({"params": [appearance.delta], "lr": 0.01})
    optimizer = torch.optim.Adam(groups)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        index = torch.randint(0, len(photos), (2,), generator=generator)
        render = scene.expand(2, *scene.shape)
        if appearance is not None:
            render = appearance(render, index)
        loss = (render - photos[index]).abs().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return scene.detach()


def test_stand_in_reconstruction_with_tinted_photos():
    g = torch.Generator().manual_seed(3)
    truth = torch.rand(12, 16, 3, generator=g) * 0.7 + 0.1
    gains = torch.empty(16, 1, 1, 1).uniform_(0.5, 1.5, generator=g) * torch.empty(16, 1, 1, 3).uniform_(0.8, 1.2, generator=g)
    photos = (truth * gains).clamp(0, 1)
    appearance = PhotoAppearance({"enabled": "true"})
    appearance.setup_for(None, len(photos))
    with_appearance = _stand_in_fit(photos, appearance)
    without = _stand_in_fit(photos, None)
    held_out = truth[None]  # an unaltered photo of the same scene
    on = held_out_scores(with_appearance[None], held_out, "left-half")[0, 0]
    off = held_out_scores(without[None], held_out, "mean")[0, 0]
    assert on > 35 and on > off + 10, (float(on), float(off))


def test_hooks_score_held_out_photos_by_the_protocol():
    class Base:
        def _score(self, out, batch):
            self._val_scores.append(torch.tensor([[-1.0, -1.0]]))

    class System(AppearanceHooks, Base):
        def __init__(self, enabled):
            self.appearance = PhotoAppearance({"enabled": enabled})
            self._val_scores = []

    render, photo = torch.rand(1, 8, 8, 3), torch.rand(1, 8, 8, 3)
    off = System("auto")
    off._score({"rgb": render}, {"rgb": photo})
    assert off._val_scores[0].tolist() == [[-1.0, -1.0]]  # the plain scores
    on = System("auto")
    on.setup_appearance(_photos(4, "nerfstudio"))
    assert on.appearance.active and on.appearance.delta.shape[0] == 4
    on._score({"rgb": render}, {"rgb": photo})
    assert torch.allclose(on._val_scores[0], held_out_scores(render, photo, "left-half"))
    assert on.appearance_index({"index": torch.tensor([1])}).tolist() == [1]

    rays = System("true")
    # ray batches that do not say which photo each ray is from: off, warned
    rays.setup_appearance(_photos(4, "nerfstudio", batches_name_their_photos=False))
    assert not rays.appearance.active
    rays.setup_appearance(_photos(4, "nerfstudio"))
    assert rays.appearance.active
    for no_photos in (None, SceneSummary(object_centric=True)):  # an export without data; generation's random views
        untouched = System("true")
        untouched.setup_appearance(no_photos)
        assert not untouched.appearance.active
    assert on.appearance_index({}) is None and on._warned_no_index


def _photos(n: int, capture_format: str = "colmap", **facts) -> SceneSummary:
    """The facts a system reads of its data for appearance: the capture's layout and the photo count."""
    intrinsics = torch.tensor([[8.0, 0.0, 4.0], [0.0, 8.0, 4.0], [0.0, 0.0, 1.0]]).repeat(n, 1, 1)
    return SceneSummary(cameras=Cameras(torch.eye(4).repeat(n, 1, 1), intrinsics, 8, 8), image_sizes=((8, 8),) * n,
                        capture_format=capture_format, **facts)


def _tiny_cameras(n: int = 2, size: int = 8):
    from lift3d.data.sample_scene import sample_cameras

    return sample_cameras("train", size)[torch.arange(n)]


def test_gaussian_system_trains_the_transforms_of_its_photos():
    from lift3d.config import load_config
    from lift3d.recipes import recipe_config
    from lift3d.systems.reconstruct_gaussians import ReconstructGaussiansSystem

    cfg = load_config(recipe_config("reconstruct-gaussians"), overrides=["system.renderer.backend=torch"])
    system = ReconstructGaussiansSystem(cfg.system)
    assert system.cfg.appearance.enabled == "auto" and not system.appearance.active
    system.gaussians.initialize(torch.randn(50, 3) * 0.5)
    system.setup_appearance(_photos(3))
    assert system.appearance.delta.shape == (3, 3, 4)
    groups = {g["name"]: g for g in system.configure_optimizers().param_groups}
    assert groups["appearance"]["params"][0] is system.appearance.delta
    cameras = _tiny_cameras()
    terms, _ = system.loss_terms(cameras, torch.ones(2, 3), torch.rand(2, 8, 8, 3), index=torch.tensor([0, 2]))
    (terms["l1"] + terms["ssim"]).backward()
    grad = system.appearance.delta.grad
    assert grad[0].abs().sum() > 0 and grad[2].abs().sum() > 0


def test_nerf_system_trains_the_transforms_of_its_photos():
    from lift3d.config import load_config
    from lift3d.recipes import recipe_config
    from lift3d.systems.reconstruct_nerf import ReconstructNerfSystem

    cfg = load_config(recipe_config("reconstruct-nerf-cpu"), overrides=["data.batch_mode=image"])
    system = ReconstructNerfSystem(cfg.system)
    system.setup_appearance(_photos(3))
    assert system.appearance.active
    groups = {g["name"]: g for g in system.configure_optimizers().param_groups}
    assert groups["appearance"]["params"][0] is system.appearance.delta
    batch = {"cameras": _tiny_cameras(1), "rgb": torch.rand(1, 8, 8, 3), "background": torch.ones(1, 3),
             "index": torch.tensor([1])}
    terms, _, _ = system.loss_terms(batch)
    terms["rgb"].backward()
    assert system.appearance.delta.grad[1].abs().sum() > 0


def test_ray_batches_name_the_photo_of_every_ray(tmp_path):
    """Each ray of a batch starts at the center of the camera its ``index`` names (photos of two sizes, padded)."""
    from lift3d.data.posed_images import PosedImagesDataModule
    from lift3d.rng import step_generator
    from tests.mixed_photo_sets import HOLDOUT, write_colmap_scene

    root = write_colmap_scene(tmp_path / "orientations", "orientations")
    module = PosedImagesDataModule({"root": str(root), "holdout_every": HOLDOUT, "batch_mode": "rays", "rays_per_batch": 512})
    assert PosedImagesDataModule.rays_carry_index
    summary = module.scene_summary()  # what the systems are handed: appearance on, sized for every training photo
    assert summary.capture_format == "colmap" and summary.batches_name_their_photos and not summary.object_centric
    assert summary.n_photos == len(module.train) and summary.mixed_sizes
    batch = module._sample_rays(3, step_generator(0, 3))
    index = batch["index"]
    assert index.shape == (512,) and int(index.min()) >= 0 and int(index.max()) < len(module.train)
    assert len(set(index.tolist())) > len(module.train) // 2  # rays from many photos
    centers = module.train.cameras.c2w[index, :3, 3]
    assert torch.allclose(batch["rays_o"], centers, atol=1e-5)

"""The low-to-high resolution schedule of the Gaussian recipe (lift3d.gaussians.resolution_schedule)."""

import pytest
import torch

from lift3d.cameras import Cameras
from lift3d.config import ConfigError, load_config
from lift3d.gaussians.resolution_schedule import check_schedule, factor_at, scaled_batch
from lift3d.gaussians.strategies import DefaultStrategy
from lift3d.recipes import recipe_config
from lift3d.systems.reconstruct_gaussians import ReconstructGaussiansSystem

SCHEDULE = [[0, 4], [1000, 2], [3000, 1]]


def _batch(width: int = 400, height: int = 300, mask: bool = True) -> dict:
    intrinsics = torch.tensor([[[500.0, 0.0, width / 2], [0.0, 500.0, height / 2], [0.0, 0.0, 1.0]]]).repeat(2, 1, 1)
    batch = {"cameras": Cameras(torch.eye(4).repeat(2, 1, 1), intrinsics, width, height),
             "rgb": torch.rand(2, height, width, 3), "alpha": torch.ones(2, height, width, 1),
             "background": torch.ones(2, 3), "index": torch.tensor([3, 5])}
    if mask:
        keep = torch.ones(2, height, width, 1)
        keep[:, :, : width // 2] = 0  # the left half ignored
        batch["loss_mask"] = keep
    return batch


def test_the_schedule_gives_the_sizes_expected_at_each_step():
    sizes = {}
    for step in (0, 999, 1000, 2999, 3000, 30000):
        out = scaled_batch(_batch(), SCHEDULE, step)
        cameras = out["cameras"]
        sizes[step] = (cameras.width, cameras.height)
        assert out["rgb"].shape == (2, cameras.height, cameras.width, 3)
        assert out["alpha"].shape == out["loss_mask"].shape == (2, cameras.height, cameras.width, 1)
    assert sizes == {0: (100, 75), 999: (100, 75), 1000: (200, 150), 2999: (200, 150), 3000: (400, 300),
                     30000: (400, 300)}
    assert factor_at([[500, 2]], 0) == 1.0 and factor_at([[500, 2]], 500) == 2.0 and factor_at([], 10) == 1.0


def test_a_scaled_batch_averages_pixels_scales_the_intrinsics_and_keeps_half_kept_mask_pixels():
    batch = _batch(mask=True)
    out = scaled_batch(batch, SCHEDULE, 0)
    torch.testing.assert_close(out["rgb"][0, 0, 0], batch["rgb"][0, :4, :4].mean(dim=(0, 1)))
    k = out["cameras"].intrinsics[0]
    assert torch.allclose(k[0], torch.tensor([125.0, 0.0, 50.0])) and torch.allclose(k[1], torch.tensor([0.0, 125.0, 37.5]))
    assert out["loss_mask"][..., :50, :].sum() == 0 and bool((out["loss_mask"][..., 50:, :] == 1).all())
    assert out["index"] is batch["index"] and out["background"] is batch["background"]
    assert scaled_batch(batch, SCHEDULE, 5000) is batch  # full size: the batch as it came
    assert scaled_batch({"rays_o": torch.zeros(4, 3)}, SCHEDULE, 0).keys() == {"rays_o"}  # not an image batch


@pytest.mark.parametrize(("schedule", "message"), [
    ([[0, 0.5]], "factors are >= 1"),
    ([[100, 2], [50, 1]], "steps must increase"),
    ([4, 2], "list of \\[step, factor\\] pairs"),
    ([[-1, 2]], "steps are whole numbers"),
])
def test_a_bad_schedule_is_refused_with_the_option_named(schedule, message):
    with pytest.raises(ConfigError, match=f"system.resolution_schedule.*{message}"):
        check_schedule(schedule)
    with pytest.raises(ConfigError, match=message):
        ReconstructGaussiansSystem({"resolution_schedule": schedule})


def test_the_schedule_is_the_systems_and_the_old_densify_key_still_loads_with_a_warning():
    """``system.resolution_schedule`` is a training-schedule option of the Gaussian recipe; the key it had under the
    densification strategy's config moves there with a FutureWarning naming the new key (one release)."""
    cfg = load_config(recipe_config("reconstruct-gaussians"), overrides=["system.resolution_schedule=[[0,2],[100,1]]"])
    assert cfg.system["resolution_schedule"] == [[0, 2], [100, 1]]
    with pytest.warns(FutureWarning, match="'system.densify.resolution_schedule'.*is now 'system.resolution_schedule'"):
        old = load_config(recipe_config("reconstruct-gaussians"),
                          overrides=["system.densify.resolution_schedule=[[0,4],[50,1]]"])
    assert old.system["resolution_schedule"] == [[0, 4], [50, 1]]  # the user's override wins over the recipe's []
    assert "resolution_schedule" not in old.system["densify"]
    system = ReconstructGaussiansSystem(old.system)
    assert system.cfg.resolution_schedule == [[0, 4], [50, 1]] and isinstance(system.densify, DefaultStrategy)
    # with MCMC too (its config never had the key): the system's key, whatever the strategy
    mcmc = load_config(recipe_config("reconstruct-gaussians"),
                       overrides=["system.densify_type=densify-mcmc", "system.resolution_schedule=[[0,2]]"])
    assert ReconstructGaussiansSystem(mcmc.system).cfg.resolution_schedule == [[0, 2]]
    with pytest.raises(ConfigError, match="unknown config key 'system.densify.resolution_schedule'"):
        load_config(recipe_config("gaussian-sds-analytic"), overrides=["system.densify.resolution_schedule=[[0,2]]"])

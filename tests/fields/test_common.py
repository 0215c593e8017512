"""What the NeRF fields share (lift3d.fields.common): central-difference normals; and the settings both refuse."""

import pytest
import torch

from lift3d.config import ConfigError
from lift3d.fields.common import central_difference_normal
from lift3d.registry import find


def test_both_fields_reject_the_same_settings_through_their_declarations():
    with pytest.raises(ConfigError, match="triplane-nerf.normal_type must be one of finite_difference; got 'analytic'"):
        find("triplane-nerf")({"normal_type": "analytic"})
    for name in ("implicit-volume", "triplane-nerf"):
        with pytest.raises(ConfigError, match=f"{name}.radius must be a number > 0; got 0.0"):
            find(name)({"radius": 0.0})
        with pytest.raises(ConfigError, match=f"{name}.density_activation must be one of .*trunc_exp.*; got 'cube'"):
            find(name)({"density_activation": "cube"})
        with pytest.raises(ConfigError, match="normal_type"):
            find(name)({"normal_type": "smooth"})


def test_central_differences_give_minus_the_gradient_direction():
    gradient = torch.tensor([1.0, -2.0, 0.5])
    points = torch.rand(10, 3)
    normals = central_difference_normal(lambda p: p @ gradient + 3.0, points, 0.01)  # linear: exact differences
    torch.testing.assert_close(normals, (-gradient / gradient.norm()).expand(10, 3))
    sphere = central_difference_normal(lambda p: -p.norm(dim=-1), points + 0.5, 1e-3)  # density falling outwards
    torch.testing.assert_close(sphere, torch.nn.functional.normalize(points + 0.5, dim=-1), atol=1e-3, rtol=0)

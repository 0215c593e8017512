"""Materials (emission, diffuse shading modes, normal shading, neural radiance) and backgrounds."""

import math
from collections import Counter

import pytest
import torch

from lift3d.registry import find
from tests.nerf_fields import single_thread  # noqa: F401  (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")


def test_emission_is_sigmoid_of_features():
    material = find("emission")({})
    features = torch.randn(5, 3)
    torch.testing.assert_close(material(features, torch.zeros(5, 3)), torch.sigmoid(features))


def test_diffuse_lambertian_by_hand():
    material = find("diffuse")({"ambient_light_color": [0.1] * 3, "diffuse_light_color": [0.9] * 3}).eval()
    albedo = torch.tensor([[0.5, 0.25, 1.0]] * 3)
    features = torch.logit(albedo)
    normals = torch.tensor([[0.0, 0.0, 1.0]] * 3)
    positions = torch.zeros(3, 3)
    # light straight above, at 60 degrees, and below the surface
    lights = torch.tensor([[0.0, 0.0, 10.0], [math.sin(math.pi / 3), 0.0, math.cos(math.pi / 3)], [0.0, 0.0, -5.0]])
    rgb = material(features, torch.zeros(3, 3), normals, positions, lights, shading="lambertian")
    expected = albedo * torch.tensor([[1.0], [0.1 + 0.9 * 0.5], [0.1]])
    torch.testing.assert_close(rgb, expected)
    textureless = material(features, torch.zeros(3, 3), normals, positions, lights, shading="textureless")
    torch.testing.assert_close(textureless, torch.tensor([[1.0], [0.55], [0.1]]).expand(3, 3))
    torch.testing.assert_close(material(features, torch.zeros(3, 3), normals, positions, lights, shading="albedo"), albedo)
    # a directional light uses light_positions as the direction itself
    directional = find("diffuse")({"light_type": "directional"})
    out = directional(features[:1], torch.zeros(1, 3), normals[:1], torch.tensor([[0.0, 0.0, 100.0]]),
                      torch.tensor([[1.0, 0.0, 1.0]]), shading="textureless")
    torch.testing.assert_close(out, torch.full((1, 3), 0.1 + 0.9 * math.cos(math.pi / 4)))


def test_diffuse_shading_modes_follow_probabilities_and_steps():
    material = find("diffuse")({"albedo_probability": 0.2, "textureless_probability": 0.3, "ambient_only_steps": 10})
    assert {material.shading_for_step(s, seed=0) for s in range(10)} == {"albedo"}
    counts = Counter(material.shading_for_step(s, seed=0) for s in range(10, 4010))
    assert abs(counts["albedo"] / 4000 - 0.2) < 0.03
    assert abs(counts["textureless"] / 4000 - 0.3) < 0.03
    assert abs(counts["lambertian"] / 4000 - 0.5) < 0.03
    # a pure function of (seed, step): resumed runs draw the same modes
    assert [material.shading_for_step(s, 3) for s in range(50)] == [material.shading_for_step(s, 3) for s in range(50)]
    material.train()
    material.update_step(0, 5)
    assert material.training_shading == "albedo"
    with pytest.raises(ValueError, match="albedo_probability \\+ textureless_probability must be at most 1"):
        find("diffuse")({"albedo_probability": 0.7, "textureless_probability": 0.6})


def test_normal_shading():
    material = find("normal-shading")({})
    normals = torch.tensor([[0.0, 0.0, 1.0], [-1.0, 0.0, 0.0]])
    torch.testing.assert_close(material(torch.zeros(2, 3), torch.zeros(2, 3), normals),
                               torch.tensor([[0.5, 0.5, 1.0], [0.0, 0.5, 0.5]]))


def test_neural_radiance_is_view_dependent_and_has_an_albedo():
    torch.manual_seed(0)
    material = find("neural-radiance")({"n_input_dims": 4, "sh_degree": 3, "hidden_dim": 16})
    features = torch.randn(6, 4)
    a = material(features, torch.tensor([[0.0, 0.0, 1.0]]).expand(6, 3))
    b = material(features, torch.tensor([[1.0, 0.0, 0.0]]).expand(6, 3))
    assert a.shape == (6, 3) and (a > 0).all() and (a < 1).all()
    assert (a - b).abs().max() > 1e-4
    axes = torch.cat([torch.eye(3), -torch.eye(3)])
    mean = torch.stack([material(features, axis.expand(6, 3)) for axis in axes]).mean(0)
    torch.testing.assert_close(material.albedo(features), mean)
    with pytest.raises(ValueError, match="n_feature_dims"):
        material(torch.randn(2, 3), torch.zeros(2, 3))


def test_solid_color_background_fixed_and_random():
    background = find("solid-color")({"color": [0.2, 0.4, 0.6], "random_probability": 1.0})
    dirs = torch.randn(4, 5, 6, 3)
    background.eval()
    torch.testing.assert_close(background(dirs), torch.tensor([0.2, 0.4, 0.6]).expand(4, 5, 6, 3))
    background.train()
    out = background(dirs)
    assert out.shape == (4, 5, 6, 3)
    assert (out - out[:, :1, :1]).abs().max() == 0  # one color per view
    assert (out[0, 0, 0] - out[1, 0, 0]).abs().max() > 0  # views differ
    learned = find("solid-color")({"learned": True})
    assert learned.color.requires_grad


def test_neural_environment_background():
    torch.manual_seed(0)
    background = find("neural-environment")({"random_probability": 0.0, "encoding": "frequency", "n_frequencies": 2})
    dirs = torch.randn(2, 8, 8, 3)
    out = background(dirs)
    assert out.shape == (2, 8, 8, 3) and (out > 0).all() and (out < 1).all()
    assert (out - out[:, :1, :1]).abs().max() > 0  # depends on direction
    out.sum().backward()
    assert background.mlp.layers[0].weight.grad.abs().sum() > 0
    augmented = find("neural-environment")({"random_probability": 1.0})
    out = augmented(dirs)
    assert (out - out[:, :1, :1]).abs().max() == 0  # replaced by one random color per view
    fixed = find("neural-environment")({"eval_color": [1.0, 1.0, 1.0]}).eval()
    torch.testing.assert_close(fixed(dirs), torch.ones(2, 8, 8, 3))

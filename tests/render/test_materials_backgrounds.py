"""Materials (emission, diffuse shading modes, normal shading, neural radiance) and backgrounds; the width of the
spherical-harmonic direction encoding in every recipe."""

import math
from collections import Counter
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import lift3d
from lift3d.config import ConfigError
from lift3d.config.layers import import_plugins, load_yaml_layers, merge_layers, register_resolvers
from lift3d.registry import find
from tests.conftest import TEST_CONFIGS
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
    material = find("neural-radiance")({"n_input_dims": 4, "sh_degree": 2, "hidden_dim": 16})
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


def test_sh_degree_is_the_highest_degree_and_out_of_range_is_a_config_error():
    material = find("neural-radiance")({"n_input_dims": 4, "sh_degree": 3})
    assert material.mlp.layers[0].in_features == 4 + 16  # degree 3: (3 + 1)^2 values, as Gaussians' SH
    background = find("neural-environment")({"sh_degree": 0})
    assert background.encode(torch.randn(5, 3)).shape == (5, 1)
    with pytest.raises(ConfigError, match="neural-radiance.sh_degree must be a number >= 0 and <= 4"):
        find("neural-radiance")({"sh_degree": 5})
    with pytest.raises(ConfigError, match="neural-environment.sh_degree must be a number >= 0 and <= 4"):
        find("neural-environment")({"sh_degree": -1})


PACKAGE = Path(lift3d.__file__).parent
RECIPES = sorted([*(PACKAGE / "configs").glob("*.yaml"), *TEST_CONFIGS.glob("*.yaml")])


def sh_widths(recipe: Path) -> dict[str, int]:
    """The number of spherical-harmonic values the recipe's neural-radiance material and neural-environment background
    encode a direction into (only the parts it has). The recipe's layers are merged and resolved as ``load_config``
    does; its parts are built from them and the system's defaults."""
    register_resolvers()
    merged = merge_layers([layer for _, layer in load_yaml_layers(recipe)])
    OmegaConf.resolve(merged)
    import_plugins([str(entry) for entry in merged.get("imports", []) or []])
    system = OmegaConf.to_container(merged.get("system", {}))
    defaults = find(merged["system_type"]).Config()
    widths = {}
    for part, kind in (("material", "neural-radiance"), ("background", "neural-environment")):
        if system.get(f"{part}_type", getattr(defaults, f"{part}_type", None)) != kind:
            continue
        built = find(kind)(system.get(part, getattr(defaults, part, {})))
        if getattr(built.cfg, "encoding", "spherical_harmonics") == "spherical_harmonics":
            widths[part] = built.mlp.layers[0].in_features - getattr(built.cfg, "n_input_dims", 0)
    return widths


def test_every_recipe_encodes_directions_to_degree_3_in_materials_and_2_in_backgrounds():
    """Materials encode the view direction to degree 3 (16 values), backgrounds to degree 2 (9 values): the widths
    the recipes' networks (and their checkpoints) are built for."""
    found = {recipe.name: sh_widths(recipe) for recipe in RECIPES}
    for name, widths in found.items():
        assert widths.get("material", 16) == 16, name
        assert widths.get("background", 9) == 9, name
    assert found["reconstruct-nerf.yaml"] == {"material": 16}  # the recipe that sets sh_degree itself
    assert sum("background" in widths for widths in found.values()) >= 5  # the text-to-3D recipes' environments

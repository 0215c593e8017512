"""Choices and bounds declared on config fields (lift3d.config.declarations), checked once when a config loads.

Every config dataclass of the package is walked: a value outside each declared field's choices or bounds is a
ConfigError naming the key; the source is scanned for comparisons of a config value against a fixed set or bound,
each of which needs a declaration on its field; and bad values reach the CLI as one line with exit code 2, before
anything trains."""

from __future__ import annotations

import dataclasses
import time
import typing
from typing import Any

import pytest
from omegaconf import OmegaConf

from lift3d.cli import main
from lift3d.config import ConfigError, bounded, choice, load_config, parse_structured, scheduled
from lift3d.config.declarations import Bounds, Choices, declaration_of
from lift3d.config.schema import check_config, check_instance
from lift3d.registry import find
from tests.config_walk import candidate_schemas, comparisons, config_schemas
from tests.conftest import REPO

SCHEMAS = config_schemas()
DECLARED = sorted(((schema, f.name) for schema in SCHEMAS for f in dataclasses.fields(schema)
                   if declaration_of(schema, f.name) is not None), key=lambda item: (item[0].__qualname__, item[1]))
# fields compared with a constant that take free values: the constants are special values among them
FREE_VALUES = {
    ("PosedImagesConfig", "test_split"): "a split name of the scene, or orbit",
    ("ViewerConfig", "host"): "any host name or address; 0.0.0.0 and '' mean every interface",
    ("PromptConfig", "prompt_cache_dir"): "a folder, or none",
    ("TrainerConfig", "strategy"): "auto or a name in Lightning's strategy registry (runs.trainer_checks.check_strategy)",
}


def key_of(schema: type, name: str) -> str:
    path = SCHEMAS[schema]
    return f"{path}.{name}" if path else name


def _integral(schema: type, name: str) -> bool:
    hint = typing.get_type_hints(schema)[name]
    return hint is int or hint == (int | None)


def bad_values(schema: type, name: str) -> list[Any]:
    """Values outside the declaration of ``schema.name`` (a list of them for a list field), of the field's type."""
    declaration = declaration_of(schema, name)
    default = next(f for f in dataclasses.fields(schema) if f.name == name)
    is_list = isinstance(default.default_factory(), list) if default.default_factory is not dataclasses.MISSING else False
    if isinstance(declaration, Choices):
        values = declaration.values()
        numbers = [v for v in values if isinstance(v, int)]
        bad: list[Any] = [max(numbers) + 1] if numbers and len(numbers) == len(values) else ["not-a-choice"]
    else:
        assert isinstance(declaration, Bounds)
        step = 1 if _integral(schema, name) else 0.5
        bad = []
        if declaration.low is not None:
            value = declaration.low - step
            while value in declaration.allowed:
                value -= step
            bad.append(value)
        bad += [limit for limit in (declaration.above, declaration.below) if limit is not None]
        if declaration.high is not None:
            bad.append(declaration.high + step)
        if declaration.multiple_of is not None:
            bad.append(declaration.sample() + 1)
        if _integral(schema, name):
            bad = [int(v) for v in bad]
    if is_list:
        lengths = getattr(declaration, "lengths", ()) or (1,)
        wrong = [[v] * max(lengths) for v in bad]
        if getattr(declaration, "lengths", ()):
            sample = declaration.sample()
            wrong.append([sample[0] if isinstance(sample, list) else sample] * (max(lengths) + 1))
        return wrong
    return bad


def test_every_config_dataclass_is_walked():
    names = {schema.__qualname__ for schema in SCHEMAS}
    assert {"ExperimentConfig", "TrainerConfig", "CheckpointConfig", "ViewerConfig", "AppearanceConfig",
            "PoseRefinementConfig", "ExportConfig", "GaussianModelConfig", "DefaultConfig", "HashGridConfig"} <= names
    assert len(DECLARED) > 400, len(DECLARED)


@pytest.mark.parametrize(("schema", "name"), DECLARED, ids=[f"{s.__qualname__}.{n}" for s, n in DECLARED])
def test_a_value_outside_a_declaration_is_a_config_error_naming_the_key(schema, name):
    key = key_of(schema, name)
    values = bad_values(schema, name)
    assert values, f"no bad value for {key}"
    for value in values:
        with pytest.raises(ConfigError) as caught:
            check_config(schema, OmegaConf.create({name: value}), SCHEMAS[schema])
        message = str(caught.value)
        assert key in message and "must be" in message and "\n" not in message, message


@pytest.mark.parametrize("schema", sorted(SCHEMAS, key=lambda s: s.__qualname__), ids=lambda s: s.__qualname__)
def test_every_default_is_within_its_declaration(schema):
    check_instance(schema(), SCHEMAS[schema], "the defaults")


def test_every_recipe_loads_within_the_declarations():
    recipes = sorted((REPO / "lift3d" / "configs").glob("*.yaml"))
    assert len(recipes) > 10
    for recipe in recipes:
        load_config(recipe)


def test_every_comparison_of_a_config_value_with_a_constant_has_a_declaration():
    """A config value compared with a fixed set or bound anywhere in the package (``cfg.mode not in (...)``,
    ``self.cfg.count < 1``, ``c.weight > 0``) means that field takes a set or a range: it must say so."""
    found, missing = 0, []
    for comparison in comparisons():
        schemas = candidate_schemas(comparison, SCHEMAS)
        if not schemas:
            continue  # not a config of the package (a diffusers config, a model's own)
        found += 1
        if any((schema.__qualname__, comparison.attribute) in FREE_VALUES for schema in schemas):
            continue
        if comparison.attribute.endswith("_type") and any(comparison.attribute[:-5] in {f.name for f in dataclasses.fields(s)}
                                                          for s in schemas):
            continue  # a part's registered name: check_config looks it up in the registry
        if not any(declaration_of(schema, comparison.attribute) for schema in schemas):
            missing.append(f"{comparison} ({', '.join(s.__qualname__ for s in schemas)}.{comparison.attribute})")
    assert found > 50, found  # the scan sees the package's comparisons
    assert not missing, "compared with a constant but declared nowhere:\n" + "\n".join(missing)


def test_the_scan_finds_the_forms_a_check_takes(tmp_path, monkeypatch):
    import tests.config_walk as walk

    source = '''
MODES = ("a", "b")
def check(c: SomeConfig, other):
    if c.mode not in MODES: pass
    size = c.size
    if size < 1: pass
    if str(c.kind).lower() == "x": pass
    if other.size < 1: pass
class Part:
    def __init__(self):
        if not 0 < self.cfg.ratio <= 1: pass
        cfg = self.cfg
        if cfg.sub.count > 0: pass
'''
    (tmp_path / "lift3d").mkdir()
    (tmp_path / "lift3d" / "sample.py").write_text(source)
    monkeypatch.setattr(walk, "PACKAGE", tmp_path / "lift3d")
    found = {(c.receiver, c.attribute, c.kind) for c in walk.comparisons()}
    assert found == {("c", "mode", "choice"), ("c", "size", "bound"), ("c", "kind", "choice"), ("self.cfg", "ratio", "bound"),
                     ("cfg.sub", "count", "bound")}


# ----------------------------------------------------------------------------------- the declarations themselves
@dataclasses.dataclass
class Sample:
    mode: str = choice("mse", "smooth_l1")
    ridge: float = bounded(1e-3, low=0)
    count: int = bounded(-1, low=1, allowed=(-1,), example=8)
    lr: Any = scheduled(1e-4, above=0)
    formats: list = choice(["glb"], among=lambda: ("glb", "obj"))
    enabled: str = choice("false", "auto", "true", fold_case=True)
    color: list = bounded([], low=0, high=1, lengths=(0, 3))
    size: int = bounded(512, low=8, multiple_of=8)
    radius: float | None = bounded(None, above=0, example=1.0)


@pytest.mark.parametrize(("value", "expected"), [
    ({"mode": "banana"}, "x.mode must be one of mse, smooth_l1; got 'banana' (in the config of x): e.g. x.mode=mse"),
    ({"ridge": -1}, "x.ridge must be a number >= 0; got -1.0 (in the config of x): e.g. x.ridge=0.001"),
    ({"count": 0}, "x.count must be a number >= 1 (or -1); got 0 (in the config of x): e.g. x.count=8"),
    ({"lr": -0.1}, "x.lr must be a number > 0; got -0.1"),
    ({"lr": [0, 1e-3, -1e-3, 100]},
     "x.lr must be a number > 0 at every point of its schedule; got -0.001 in [0,0.001,-0.001,100]"),
    ({"lr": [[0, 1e-3], [10, 0.0]]}, "at every point of its schedule; got 0.0"),
    ({"formats": ["glb", "fbx"]}, "x.formats must be one of glb, obj (each element); got 'fbx' in [glb,fbx]"),
    ({"enabled": "banana"}, "x.enabled must be one of false, auto, true; got 'banana'"),
    ({"enabled": 2}, "got '2'"),
    ({"color": [0.5, 0.5]}, "x.color must be a list of 0 or 3 values, each a number >= 0 and <= 1; got [0.5,0.5]"),
    ({"color": [0.5, 0.5, 2]}, "got 2 in [0.5,0.5,2]"),
    ({"size": 100}, "x.size must be a number >= 8 and a multiple of 8; got 100"),
    ({"radius": 0.0}, "x.radius must be a number > 0; got 0.0"),
])
def test_a_declaration_names_the_key_the_value_the_range_and_an_example(value, expected):
    with pytest.raises(ConfigError) as caught:
        parse_structured(Sample, value, path="x")
    assert expected in str(caught.value)


def test_values_within_the_declarations_pass_and_keep_their_types():
    cfg = parse_structured(Sample, {"enabled": True, "count": -1, "lr": [0, 1e-5, 1e-3, 100], "radius": None,
                                    "formats": ["obj", "glb"], "color": [0.1, 0.2, 0.3], "size": 64})
    assert cfg.enabled == "True" and cfg.count == -1 and cfg.radius is None and cfg.size == 64
    assert parse_structured(Sample, {"radius": 2.5}).radius == 2.5


def test_an_instance_built_in_code_is_checked_too():
    with pytest.raises(ConfigError, match="part.mode must be one of"):
        parse_structured(Sample, Sample(mode="banana"), path="part")


def test_a_subclass_that_changes_a_default_keeps_the_declaration():
    @dataclasses.dataclass
    class Child(Sample):
        ridge: float = 0.5

    assert parse_structured(Child, {}).ridge == 0.5
    with pytest.raises(ConfigError, match="x.ridge must be a number >= 0"):
        parse_structured(Child, {"ridge": -1.0}, path="x")


def test_a_part_built_from_a_dict_is_checked_against_its_declarations():
    choices = "auto, random, hull, hull_surface, sfm, points, mesh, ply"
    with pytest.raises(ConfigError, match=f"gaussians.init must be one of {choices}; got 'ban"):
        find("gaussians")({"init": "banana"})


def test_the_error_says_which_layer_wrote_the_value(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("base: " + str(REPO / "lift3d" / "configs" / "reconstruct-gaussians.yaml")
                      + "\nsystem:\n  appearance:\n    fit_ridge: -2\n")
    with pytest.raises(ConfigError, match=f"system.appearance.fit_ridge must be a number >= 0; got -2.0 \\(in {recipe}\\)"):
        load_config(recipe)
    with pytest.raises(ConfigError, match="got -3.0 \\(in the command-line overrides\\)"):
        load_config(recipe, overrides=["system.appearance.fit_ridge=-3"])


# ----------------------------------------------------------------------------------- through the CLI
AUDIT_CASES = [
    ("system.gaussians.init=banana", "system.gaussians.init must be one of auto, random, hull, hull_surface, sfm, points, "
                                     "mesh, ply; got 'banana' (in the command-line overrides): e.g. system.gaussians.init=auto"),
    ("system.appearance.enabled=banana", "system.appearance.enabled must be one of auto, true, false; got 'banana'"),
    ("system.appearance.eval=banana", "system.appearance.eval must be one of left-half, mean; got 'banana'"),
    ("system.pose_refinement.enabled=2", "system.pose_refinement.enabled must be one of auto, true, false; got '2'"),
    ("system.pose_refinement.lr=-0.1", "system.pose_refinement.lr must be a number >= 0; got -0.1"),
    ("system.appearance.fit_ridge=-1", "system.appearance.fit_ridge must be a number >= 0; got -1.0"),
]


@pytest.mark.parametrize(("override", "expected"), AUDIT_CASES, ids=[case[0] for case in AUDIT_CASES])
def test_a_bad_value_is_one_line_with_exit_code_2_before_anything_runs(override, expected, tmp_path, capsys):
    start = time.monotonic()
    code = main(["reconstruct", f"output_root={tmp_path}", "trainer.max_steps=2", override])
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("lift3d: error:")]
    assert code == 2, err[-2000:]
    assert "internal error" not in err and "Traceback" not in err, err[-2000:]
    assert len(errors) == 1 and expected in errors[0], err[-2000:]
    assert "Blender layout" not in err  # refused when the config loaded, before the scene was read
    assert not any(tmp_path.iterdir())  # no run folder: nothing ran
    assert elapsed < 20, elapsed

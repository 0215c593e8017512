"""Renamed and moved config keys (a schema's ``RENAMED``, lift3d.config.schema.migrate_renamed_keys): the old key loads
for one release with a FutureWarning naming the new one, at one level or across levels (a dotted name)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import ClassVar

import pytest
from omegaconf import OmegaConf

from lift3d.config import ConfigError, parse_structured
from lift3d.config.schema import Sources, migrate_renamed_keys


@dataclass
class Inner:
    RENAMED: ClassVar[dict[str, str]] = {"old_rate": "rate"}

    rate: float = 1.0  # a renamed key, one level


@dataclass
class Outer:
    # moved out of the inner config, into it, and renamed at this level
    RENAMED: ClassVar[dict[str, str]] = {"inner.schedule": "schedule", "depth": "inner.levels", "colour": "color"}

    schedule: list = field(default_factory=list)  # moved up from inner
    color: str = "gray"  # renamed at this level
    inner: dict = field(default_factory=dict)  # an untyped sub-config: the move happens before it is read


def test_a_key_renamed_in_place_loads_with_a_warning():
    with pytest.warns(FutureWarning, match="'colour'.*is now 'color'.*until the next release"):
        cfg = parse_structured(Outer, {"colour": "red"})
    assert cfg.color == "red"
    with pytest.warns(FutureWarning, match="'old_rate'.*is now 'rate'"):
        assert parse_structured(Inner, {"old_rate": 0.5}).rate == 0.5


def test_a_key_moved_out_of_a_sub_config_loads_with_a_warning():
    with pytest.warns(FutureWarning, match="'inner.schedule'.*is now 'schedule'"):
        cfg = parse_structured(Outer, {"inner": {"schedule": [[0, 2]], "kept": 1}})
    assert cfg.schedule == [[0, 2]] and cfg.inner == {"kept": 1}


def test_a_key_moved_into_a_sub_config_makes_the_sub_config():
    node = OmegaConf.create({"depth": 3})
    with pytest.warns(FutureWarning, match="'depth'.*is now 'inner.levels'"):
        migrate_renamed_keys(Outer, node)
    assert OmegaConf.to_container(node) == {"inner": {"levels": 3}}


def test_new_keys_load_silently_and_a_missing_parent_is_no_old_key():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert parse_structured(Outer, {"schedule": [[0, 4]], "inner": {}}).schedule == [[0, 4]]
        assert parse_structured(Outer, {"color": "blue"}).schedule == []
        node = OmegaConf.create({"inner": None})
        migrate_renamed_keys(Outer, node)  # no mapping under inner: no old key to move
        assert OmegaConf.to_container(node) == {"inner": None}


def test_old_and_new_keys_in_one_layer_are_an_error_and_the_later_layer_wins_otherwise():
    with pytest.raises(ConfigError, match="'inner.schedule'.*is the old name of 'schedule', and both are set"):
        parse_structured(Outer, {"schedule": [[0, 2]], "inner": {"schedule": [[0, 4]]}})
    recipe = OmegaConf.create({"schedule": [[0, 2]]})
    override = OmegaConf.create({"inner": {"schedule": [[0, 4]]}})
    sources = Sources([("recipe.yaml", recipe), ("the command line", override)])
    merged = OmegaConf.merge(recipe, override)
    with pytest.warns(FutureWarning, match=r"'inner.schedule' \(in the command line\)"):
        migrate_renamed_keys(Outer, merged, "", sources)
    assert merged.schedule == [[0, 4]] and "schedule" not in merged.inner  # the user's override over the recipe
    sources = Sources([("old.yaml", override), ("recipe.yaml", recipe)])
    merged = OmegaConf.merge(override, recipe)
    with pytest.warns(FutureWarning):
        migrate_renamed_keys(Outer, merged, "", sources)
    assert merged.schedule == [[0, 2]] and "schedule" not in merged.inner  # the later layer's new key wins

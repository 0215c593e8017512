from dataclasses import dataclass, field
from typing import Any

import pytest

from lift3d.base import BaseModule
from lift3d.config import ConfigError, load_config, parse_structured, scheduled
from lift3d.registry import register
from tests.conftest import TEST_CONFIGS

FIT_IMAGE = TEST_CONFIGS / "fit-image.yaml"


def test_yaml_merge_and_dotlist_overrides(tmp_path):
    extra = tmp_path / "extra.yaml"
    extra.write_text("trainer:\n  max_steps: 7\nsystem:\n  hidden: 8\n")
    cfg = load_config(FIT_IMAGE, extra, overrides=["system.optimizer.args.lr=0.5", "tag=hello"])
    assert cfg.trainer.max_steps == 7  # second file wins over the first
    assert cfg.system["hidden"] == 8
    assert cfg.system["optimizer"]["args"]["lr"] == 0.5  # override wins over both
    assert cfg.system["resolution"] == 16  # untouched keys survive
    assert cfg.tag == "hello"


def test_interpolations_resolve(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(f"base: {FIT_IMAGE}\nname: fit\ntag: ${{name}}-${{system.resolution}}\nseed: ${{mul:3,4}}\n")
    cfg = load_config(path)
    assert cfg.tag == "fit-16"
    assert cfg.seed == 12


def test_unknown_top_level_key_names_source_and_closest(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_config(FIT_IMAGE, overrides=["sed=3"])
    message = str(error.value)
    assert "'sed'" in message and "command-line" in message and "Did you mean 'seed'" in message


def test_unknown_nested_key_in_yaml_is_reported_with_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(f"base: {FIT_IMAGE}\nsystem:\n  loss:\n    lambda_mes: 1.0\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert "system.loss.lambda_mes" in message
    assert str(path) in message
    assert "system.loss.lambda_mse" in message


def test_unknown_key_in_data_part_uses_data_schema():
    with pytest.raises(ConfigError, match=r"data.heigth.*Did you mean 'data.height'"):
        load_config(FIT_IMAGE, overrides=["data.heigth=32"])


def test_type_errors_are_reported():
    with pytest.raises(ConfigError, match="trainer.max_steps"):
        load_config(FIT_IMAGE, overrides=["trainer.max_steps=lots"])


def test_bad_schedule_is_reported():
    with pytest.raises(ConfigError, match="system.loss.lambda_smooth.*ramp"):
        load_config(FIT_IMAGE, overrides=["system.loss.lambda_smooth=[1,2]"])


def test_unknown_part_type_lists_registered_names():
    with pytest.raises(ConfigError, match=r"system_type.*Did you mean 'test-fit-image'"):
        load_config(FIT_IMAGE, overrides=["system_type=test-fit-imag"])


def test_missing_file_and_bad_override():
    with pytest.raises(ConfigError, match="not found"):
        load_config("no/such.yaml")
    with pytest.raises(ConfigError, match="key=value"):
        load_config(FIT_IMAGE, overrides=["seed"])


@dataclass
class _InnerConfig:
    width: int = 4  # a width
    gain: Any = scheduled(1.0)  # a scheduled gain


@register("test-config-inner")
class _Inner(BaseModule):
    Config = _InnerConfig


@dataclass
class _OuterConfig:
    inner_type: str = "test-config-inner"  # which inner part
    inner: dict = field(default_factory=dict)  # its config


def test_typed_sub_parts_are_validated_recursively():
    parsed = parse_structured(_OuterConfig, {"inner": {"width": 8, "gain": [0, 1.0, 2.0, 10]}})
    assert parsed.inner == {"width": 8, "gain": [0, 1.0, 2.0, 10]}
    with pytest.raises(ConfigError, match=r"inner.widht.*Did you mean 'inner.width'"):
        parse_structured(_OuterConfig, {"inner": {"widht": 8}})
    module = _Inner({"width": 3})
    assert module.cfg.width == 3 and module.cfg.gain == 1.0


def test_escaped_keys_and_arithmetic_resolvers_on_every_omegaconf():
    """A dotted parameter-group name escaped on the command line, and ${mul:...} over another key (omegaconf 2.3
    split the first and handed the second its raw text)."""
    from lift3d.recipes import recipe_config

    cfg = load_config(recipe_config("reconstruct-nerf"),
                      overrides=["system.optimizer.params.field\\.encoding.lr=0.05", "trainer.max_steps=1000"])
    params = cfg.system["optimizer"]["params"]
    assert params["field.encoding"] == {"lr": 0.05}
    assert params["field"]["lr"][1] == [5.0, 0.01]  # [${mul:${trainer.max_steps},0.005}, 0.01]

"""Config and app-recipe YAML files as attackers make them: a Python tag that would run a command when loaded by an
unsafe loader, an alias bomb (a kilobyte that expands to a billion nodes), a file far larger than any config. Each is
refused by name through the CLI (exit 2, one line, no traceback, in seconds), and the command never runs."""

from __future__ import annotations

import pytest

from tests.hostile import refused

BOMB = "".join(f"{name}: &{name} [{', '.join([f'*{prev}'] * 9)}]\n"
               for prev, name in zip("abcdefghi", "bcdefghij"))  # nine levels of nine aliases each: 9^9 nodes


@pytest.fixture
def hostile_yaml(tmp_path):
    """name -> a hostile YAML file, and the marker its Python tag would write if it ran."""
    marker = tmp_path / "PWNED"
    files = {
        "tag.yaml": f"name: !!python/object/apply:os.system ['touch {marker}']\n",
        "recipe-tag.yaml": f"- label: evil\n  config: !!python/object/apply:os.system ['touch {marker}']\n",
        "bomb.yaml": "a: &a [x, x, x, x, x, x, x, x, x]\n" + BOMB,
        "huge.yaml": "name: x\n" + "# padding\n" * (1 << 20),  # 10 MiB of comments
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path, marker


def test_hostile_config_files_are_refused_by_name(hostile_yaml, capsys):
    folder, marker = hostile_yaml
    refused(["train", str(folder / "tag.yaml")], capsys, "tag.yaml", "YAML tag !!python/object/apply:os.system",
            "safe YAML loader")
    refused(["train", str(folder / "bomb.yaml")], capsys, "bomb.yaml", "YAML aliases", seconds=60)
    refused(["train", str(folder / "huge.yaml")], capsys, "huge.yaml", "bytes", "LIFT3D_MAX_CONFIG_BYTES")
    refused(["export", str(folder / "tag.yaml"), "--resume", str(folder / "none.ckpt")], capsys, "YAML tag")
    assert not marker.exists()


def test_hostile_app_recipe_files_are_refused_before_the_app_starts(hostile_yaml, capsys):
    folder, marker = hostile_yaml
    refused(["app", "--recipes", str(folder / "recipe-tag.yaml")], capsys, "recipe-tag.yaml",
            "YAML tag !!python/object/apply:os.system")
    refused(["app", "--recipes", str(folder / "bomb.yaml")], capsys, "bomb.yaml", "YAML aliases", seconds=60)
    refused(["app", "--recipes", str(folder / "huge.yaml")], capsys, "LIFT3D_MAX_CONFIG_BYTES")
    refused(["app", "--recipes", str(folder / "missing.yaml")], capsys, "app recipes file not found")
    assert not marker.exists()

"""A run folder someone shares is data, not code: the ``imports:`` of a config inside a run folder never run
unless ``--allow-imports`` is given, on every command that reads run folders. A marker file that the plugin
would write proves it never ran."""

from __future__ import annotations

import json
import shutil
import sys
import uuid

import pytest
from omegaconf import OmegaConf

import lift3d.config.layers as config_layers
from lift3d.cli import main
from lift3d.config import ConfigError, load_config
from lift3d.recipes import recipe_config
from tests.sample_runs import finished_sample_run

RECIPE = recipe_config("reconstruct-gaussians-sample")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished two-step sample reconstruction, to copy into 'shared' run folders."""
    root = tmp_path_factory.mktemp("trust")
    return finished_sample_run(root)


@pytest.fixture
def shared(finished_run, tmp_path, monkeypatch):
    """(a copy of the run whose parsed.yaml lists a plugin, the marker that plugin writes when it runs). The plugin
    has a fresh name, so no earlier import in this process counts; it and --allow-imports are forgotten afterwards."""
    run = tmp_path / "downloads" / "sample_scene"
    shutil.copytree(finished_run, run)
    marker = tmp_path / "PWNED"
    stem = f"helper_{uuid.uuid4().hex[:8]}"
    (run / "configs" / f"{stem}.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n")
    parsed = OmegaConf.load(run / "configs" / "parsed.yaml")
    parsed.imports = [f"{stem}.py"]
    (run / "configs" / "parsed.yaml").write_text(OmegaConf.to_yaml(parsed))
    monkeypatch.setattr(config_layers, "_RUN_IMPORTS_ALLOWED", False)
    yield run, marker, stem
    sys.modules.pop(f"lift3d_plugin_{stem}", None)


def _refused(capsys, argv: list[str], stem: str) -> None:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert "lists imports" in err and f"{stem}.py" in err and "--allow-imports" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_shared_run_folders_imports_never_run_without_the_flag(shared, tmp_path, capsys):
    run, marker, stem = shared
    parsed, last = run / "configs" / "parsed.yaml", run / "ckpts" / "last.ckpt"
    c2w = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 4], [0, 0, 0, 1]]
    (tmp_path / "path.json").write_text(json.dumps({"keyframes": [{"c2w": c2w}]}))
    for argv in (["export", str(run)], ["validate", str(run)], ["test", str(run)],
                 ["export", str(parsed), "--resume", str(last)],  # the run's config named directly
                 ["train", str(parsed), "--resume", str(last), "trainer.max_steps=3"],  # resuming it
                 ["render", str(run), "--path", str(tmp_path / "path.json"), "--out", str(tmp_path / "v.mp4")],
                 ["render", str(last), "--path", str(tmp_path / "path.json"), "--out", str(tmp_path / "v.mp4")],
                 ["edit", str(run), "make it bronze", "--editor", "analytic"]):
        _refused(capsys, argv, stem)
        assert not marker.exists(), argv
    from lift3d.viewer.models import load_view_model  # what `lift3d view RUN` loads, before it serves

    with pytest.raises(ConfigError, match="--allow-imports"):
        load_view_model(run)
    assert not marker.exists() and not (tmp_path / "v.mp4").exists()

    # with the flag, the plugin is imported (and the export goes on)
    assert main(["export", str(run), "--allow-imports", "--format", "3dgs-ply"]) == 0, capsys.readouterr().err
    assert marker.read_text() == "ran"


def test_the_viewer_imports_a_runs_plugins_only_when_allowed(shared):
    run, marker, _ = shared
    from lift3d.viewer.models import load_view_model

    with pytest.raises(ConfigError, match="lists imports"):
        load_view_model(run / "ckpts" / "last.ckpt")
    assert not marker.exists()
    model = load_view_model(run, allow_imports=True)
    assert marker.exists() and model.system is not None


def test_explicit_configs_import_as_before_and_run_folder_configs_are_told_apart(tmp_path, monkeypatch):
    monkeypatch.setattr(config_layers, "_RUN_IMPORTS_ALLOWED", False)
    stem = f"plugin_{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "imported"
    (tmp_path / f"{stem}.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('yes')\n")
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"base: {RECIPE}\nimports: [{stem}.py]\n")
    # a run folder's config (and any file it pulls in with base:) is not trusted; a file of the user's is
    run_configs = tmp_path / "run" / "configs"
    run_configs.mkdir(parents=True)
    (run_configs / "parsed.yaml").write_text(f"base: {mine}\n")
    (run_configs / "copy.yaml").write_text(f"base: {RECIPE}\nimports: ['${{tag}}']\ntag: {tmp_path / stem}.py\n")
    assert config_layers.in_run_folder(run_configs / "copy.yaml") and not config_layers.in_run_folder(mine)
    try:
        expected = f"mine.yaml \\(the base of {run_configs / 'parsed.yaml'}\\) lists imports: .*{stem}.py"
        with pytest.raises(ConfigError, match=expected):
            load_config(run_configs / "parsed.yaml")
        with pytest.raises(ConfigError, match="lists imports"):  # an interpolated entry is refused as well
            load_config(run_configs / "copy.yaml")
        with pytest.raises(ConfigError, match="lists imports"):
            load_config(mine, allow_imports=False)
        assert not marker.exists()
        assert load_config(run_configs / "parsed.yaml", overrides=["imports=[]"]).imports == []  # nothing to import
        assert load_config(mine).imports == [str(tmp_path / f"{stem}.py")]  # the user's own config: imported
        assert marker.read_text() == "yes"
        marker.unlink()
        load_config(run_configs / "copy.yaml")  # already imported in this process: nothing would run, so it loads
        assert not marker.exists()
    finally:
        sys.modules.pop(f"lift3d_plugin_{stem}", None)


@pytest.mark.parametrize("link", ["parsed.yaml", "configs"])
def test_a_symlink_in_a_run_folders_config_chain_does_not_let_its_imports_run(shared, tmp_path, capsys, link):
    """The guard decides on the path as given and as resolved: ``RUN/configs/parsed.yaml`` linked to
    ``../settings.yaml``, or ``RUN/configs`` linked to a folder of another name, is still a run folder's config."""
    run, marker, stem = shared
    configs = run / "configs"
    if link == "parsed.yaml":
        (configs / "parsed.yaml").rename(run / "settings.yaml")
        (configs / "parsed.yaml").symlink_to("../settings.yaml")
    else:
        moved = tmp_path / "elsewhere" / "settings"
        moved.parent.mkdir()
        configs.rename(moved)
        configs.symlink_to(moved, target_is_directory=True)
    for argv in (["export", str(run), "--format", "3dgs-ply"], ["validate", str(run)],
                 ["export", str(configs / "parsed.yaml"), "--resume", str(run / "ckpts" / "last.ckpt")]):
        _refused(capsys, argv, stem)
        assert not marker.exists(), argv
    from lift3d.viewer.models import load_view_model  # what `lift3d view RUN` loads, before it serves

    with pytest.raises(ConfigError, match="--allow-imports"):
        load_view_model(run)
    if link == "parsed.yaml":
        with pytest.raises(ConfigError, match="lists imports"):  # the link's target: a file of the run folder as well
            load_config(run / "settings.yaml")
    assert not marker.exists()
    assert main(["export", str(run), "--allow-imports", "--format", "3dgs-ply"]) == 0, capsys.readouterr().err
    assert marker.read_text() == "ran"

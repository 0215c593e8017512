"""A plugin package adds one extension of every kind through the ``lift3d.modules`` entry point
(``tests/plugins/every_kind.py``), and every front end finds them: ``find`` / ``entries``, the capture format detection
``lift3d reconstruct`` uses, ``lift3d export --format NAME``, reading a Gaussian file by its suffix, ``lift3d info``."""

from __future__ import annotations

import importlib.metadata
import sys

import numpy as np
import pytest
import torch

from lift3d import registry
from lift3d.cli import main
from lift3d.data import formats
from lift3d.data.scene import read_capture
from lift3d.gaussians.formats.files import load_gaussian_file, reader_suffixes, save_gaussian_file
from lift3d.gaussians.formats.ply import save_ply
from lift3d.registry import CAPTURE_FORMAT, ENTRY_POINT_GROUP, EXPORT_FORMAT, GAUSSIAN_CODEC, PART, RegistryError
from lift3d.sh import sh_to_rgb
from tests.gaussian_params import random_params

PLUGIN = "tests.plugins.every_kind"


def fake_entry_points(monkeypatch, *values: str) -> None:
    """Installed distributions declaring ``values`` (module paths) in the ``lift3d.modules`` group."""
    points = [importlib.metadata.EntryPoint(name=value.rsplit(".", 1)[-1], value=value, group=ENTRY_POINT_GROUP)
              for value in values]
    real = importlib.metadata.entry_points

    def entry_points(**selection):
        return points if selection.get("group") == ENTRY_POINT_GROUP else real(**selection)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)


@pytest.fixture
def isolated_registry(monkeypatch):
    """The registry as it is with every built-in loaded, restored after the test (plugins registered in it vanish)."""
    for kind in registry.KINDS:
        registry.entries(kind)
    monkeypatch.setattr(registry, "_entries", {kind: dict(table) for kind, table in registry._entries.items()})
    monkeypatch.setattr(registry, "_loaded_entry_points", False)
    yield
    sys.modules.pop(PLUGIN, None)


@pytest.fixture
def plugin(isolated_registry, monkeypatch):
    fake_entry_points(monkeypatch, PLUGIN)


def test_the_plugin_adds_one_entry_of_every_kind(plugin):
    part = registry.find("plugin-every-kind-part")
    assert part.__module__ == PLUGIN and part.registered_name == "plugin-every-kind-part"
    assert registry.find("survey-csv", CAPTURE_FORMAT).read is not None
    assert registry.find(".pts", GAUSSIAN_CODEC).write is not None
    assert registry.find("pts", EXPORT_FORMAT).source == "gaussian_params"
    for kind, name, builtin in [(PART, "plugin-every-kind-part", "random-views"), (CAPTURE_FORMAT, "survey-csv", "colmap"),
                                (GAUSSIAN_CODEC, ".pts", ".spz"), (EXPORT_FORMAT, "pts", "glb")]:
        table = registry.entries(kind)
        assert name in table and builtin in table, kind
        assert registry.owners(kind)[name] == PLUGIN or registry.owners(kind)[name].startswith(f"{PLUGIN}."), kind
    # detection order is by priority: the plugin's 50 sits between COLMAP (30) and a folder of photos (90)
    names = [record.name for record in formats.formats()]
    assert names.index("colmap") < names.index("survey-csv") < names.index("photos")


def survey(root, rows):
    root.mkdir()
    for name, *_ in rows:
        (root / name).write_bytes(b"")  # detection and reading look at names only
    lines = ["image,width,height,focal,x,y,z", *(",".join(map(str, row)) for row in rows)]
    (root / "cameras.csv").write_text("\n".join(lines) + "\n")
    return root


def test_reconstruct_detects_and_reads_a_plugin_capture_format(plugin, tmp_path):
    from lift3d.commands.reconstruct import _help
    from lift3d.data.scene import detect

    rows = [("IMG_0001.JPG", 4032, 3024, 3100.5, 0, 0, 2.5), ("IMG_0002.JPG", 3024, 4032, 3100.5, 1, 0, 2)]
    root = survey(tmp_path / "site", rows)
    assert formats.detect(root).name == "survey-csv"  # what `lift3d reconstruct PATH` asks first
    assert detect(root).name == "survey-csv" and formats.detect(root, posed_only=True).name == "survey-csv"
    capture, downscale = read_capture(root)
    assert capture.format == "survey-csv" and downscale == 1 and len(capture.frames) == 2
    assert capture.frames[1].lens.width == 3024 and capture.frames[1].c2w[0, 3] == 1.0
    assert read_capture(root, format="survey-csv")[0].format == "survey-csv"  # data.format names it too
    assert "survey-csv" in formats.config_names()
    assert "a survey (cameras.csv beside its photos)" in formats.posed_list() and "survey (cameras.csv" in _help()
    assert formats.is_photographed("survey-csv")


def test_a_plugin_codec_reads_and_writes_by_suffix(plugin, tmp_path):
    path = tmp_path / "scan.pts"
    path.write_text("0.5 -1.25 2 1 0 0\n-3 0 0.125 0.2 0.4 0.6\n")  # as another tool writes it: no header
    params = load_gaussian_file(path)
    assert params["means"].shape == (2, 3) and params["shN"].shape == (2, 0, 3)
    torch.testing.assert_close(sh_to_rgb(params["sh0"][1, 0]), torch.tensor([0.2, 0.4, 0.6]))
    assert ".pts" in reader_suffixes()
    again = save_gaussian_file(tmp_path / "again.PTS", params)
    torch.testing.assert_close(load_gaussian_file(again)["means"], params["means"])


def test_lift3d_export_converts_into_and_out_of_the_plugin_formats(plugin, tmp_path, capsys):
    source = random_params(30, degree=1, seed=3)
    save_ply(tmp_path / "model.ply", source)
    assert main(["export", str(tmp_path / "model.ply"), "--format", "pts", "3dgs-ply"]) == 0
    points = tmp_path / "model-ply.pts"
    np.testing.assert_allclose(load_gaussian_file(points)["means"].numpy(), source["means"].numpy(), atol=1e-5)
    assert main(["export", str(points), "--format", "3dgs-ply"]) == 0  # `lift3d export FILE` reads it by its suffix
    back = load_gaussian_file(tmp_path / "model-ply-pts-gaussians.ply")
    np.testing.assert_allclose(back["means"].numpy(), source["means"].numpy(), atol=1e-5)
    capsys.readouterr()
    assert main(["info"]) == 0
    assert any(line.split()[:2] == ["pts", "ok"] for line in capsys.readouterr().out.splitlines())


def test_an_unknown_export_format_names_the_closest(plugin, tmp_path, capsys):
    save_ply(tmp_path / "model.ply", random_params(10, degree=0))
    assert main(["export", str(tmp_path / "model.ply"), "--format", "ptss"]) == 2
    err = capsys.readouterr().err
    assert "unknown export format 'ptss' (did you mean pts?)" in err and "glb (" in err


def test_a_plugin_claiming_a_builtin_name_is_an_error_naming_both(isolated_registry, monkeypatch, tmp_path):
    (tmp_path / "clashing_plugin.py").write_text(
        "from lift3d.gaussians.formats.codec import register_codec\n"
        "register_codec('.SPZ', lambda path: {}, None, 'another .spz')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fake_entry_points(monkeypatch, "clashing_plugin")
    with pytest.raises(RegistryError) as error:
        registry.find(".nope", GAUSSIAN_CODEC)
    message = str(error.value)
    assert "Gaussian file codec '.spz' is registered twice" in message
    assert "lift3d.gaussians.formats.spz" in message and "clashing_plugin" in message
    sys.modules.pop("clashing_plugin", None)


def test_a_broken_plugin_warns_and_the_builtins_stay(isolated_registry, monkeypatch, caplog):
    fake_entry_points(monkeypatch, "no_such_lift3d_plugin_module")
    assert "blender" in registry.entries(CAPTURE_FORMAT)
    assert "no_such_lift3d_plugin_module" in caplog.text

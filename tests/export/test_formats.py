"""``export_formats`` and ``lift3d export``: every format from one call, errors, config, the CLI."""

import logging
import re

import numpy as np
import pytest
import torch
from plyfile import PlyData

from lift3d.cli import main
from lift3d.config import ConfigError, load_config, parse_structured
from lift3d.export import ExportConfig, ExportSources, GaussianTensors, export_formats, gaussian_sources, mesh_from_field
from lift3d.gaussians.formats.splat import read_splat
from lift3d.runs.runner import run_experiment
from lift3d.saving import OutputSaver
from tests.conftest import TEST_CONFIGS
from tests.export.test_gaussians import skin_of_sphere
from tests.gaussians.formats.test_splat import raw_gaussians, reference_3dgs_ply
from tests.plugins.analytic_sphere import position_color, render_sphere, sphere_density
from tests.validators import validate_gltf

SMALL = dict(resolution=24, texture_size=64, target_faces=0, video_frames=4, video_width=32, video_height=32, video_distance=2.5)


def _field_sources(calls: list) -> ExportSources:
    def mesh():
        calls.append("mesh")
        return mesh_from_field(lambda p: sphere_density(p, 0.5), [[-1, -1, -1], [1, 1, 1]], ExportConfig(**SMALL),
                               color_fn=position_color)

    return ExportSources(mesh=mesh, color_fn=position_color, render_fn=lambda c: render_sphere(c, 0.5))


def test_field_sources_write_every_mesh_and_video_format_once(tmp_path):
    calls = []
    written = export_formats(OutputSaver(tmp_path), ["glb", "obj", "mesh-ply", "mp4", "gif", "glb"], ExportConfig(**SMALL),
                             _field_sources(calls), stem="it7")
    names = [p.name for p in written]
    assert names == ["it7.glb", "it7.obj", "it7.png", "it7.mtl", "it7-mesh.ply", "it7-orbit.mp4", "it7-orbit.gif"]
    assert all(p.is_file() and p.stat().st_size > 0 for p in written)
    assert calls == ["mesh"]  # one extraction for all mesh formats
    assert validate_gltf(tmp_path / "it7.glb")[0]["issues"]["numErrors"] == 0
    assert "red" in [p.name for p in PlyData.read(tmp_path / "it7-mesh.ply")["vertex"].properties]


def test_texture_size_zero_writes_vertex_colors(tmp_path):
    cfg = ExportConfig(**{**SMALL, "texture_size": 0, "stem": "plain"})
    written = export_formats(OutputSaver(tmp_path), ["glb", "obj"], cfg, _field_sources([]))
    assert [p.name for p in written] == ["plain.glb", "plain.obj"]  # no texture, no .mtl
    info = validate_gltf(tmp_path / "plain.glb")[0]["info"]
    assert not info["hasTextures"] and info["maxAttributes"] >= 3  # POSITION, NORMAL, COLOR_0


def test_gaussian_sources_write_gaussians_and_their_mesh(tmp_path):
    raw = raw_gaussians(32)
    g, _ = skin_of_sphere(n=600)
    sources = gaussian_sources(g, ExportConfig(**SMALL), write_3dgs_ply=lambda path, **kept: reference_3dgs_ply(path, raw),
                               render_fn=lambda c: render_sphere(c, 0.55))
    written = export_formats(OutputSaver(tmp_path), ["3dgs-ply", "splat", "glb", "mp4"], ExportConfig(**SMALL), sources, stem="g")
    assert [p.name for p in written] == ["g-gaussians.ply", "g.splat", "g.glb", "g-orbit.mp4"]
    assert len(read_splat(tmp_path / "g.splat").means) == len(g.means)
    assert PlyData.read(tmp_path / "g-gaussians.ply")["vertex"].count == 32
    assert validate_gltf(tmp_path / "g.glb")[0]["issues"]["numErrors"] == 0


def test_formats_that_cannot_be_made_are_errors_naming_the_alternatives(tmp_path):
    sources = _field_sources([])
    saver = OutputSaver(tmp_path)
    with pytest.raises(ValueError, match="ambiguous: use mesh-ply"):
        export_formats(saver, ["ply"], ExportConfig(), sources)
    with pytest.raises(ValueError, match=r"unknown export format 'fbx'.*glb"):
        export_formats(saver, ["fbx"], ExportConfig(), sources)
    with pytest.raises(ValueError, match=r"cannot export 'splat'.*it can export: glb, obj, mesh-ply, mp4, gif"):
        export_formats(saver, ["glb", "splat"], ExportConfig(), sources)
    assert not any(tmp_path.iterdir())  # checked before anything is written


def test_export_config_is_a_structured_config():
    cfg = parse_structured(ExportConfig, {"resolution": 64, "threshold": 10.0, "formats": ["glb", "mp4"]})
    assert cfg.resolution == 64 and cfg.threshold == 10.0 and cfg.formats == ["glb", "mp4"]
    with pytest.raises(ConfigError, match="resolutoin"):
        parse_structured(ExportConfig, {"resolutoin": 64})


def test_lift3d_export_writes_and_lists_the_files(tmp_path, capsys, caplog):
    config = TEST_CONFIGS / "analytic-sphere.yaml"
    quiet = ["trainer.enable_progress_bar=false", "use_timestamp=false", f"output_root={tmp_path}"]
    run_dir = run_experiment("train", load_config(config, overrides=quiet), [config], [])
    checkpoint = run_dir / "ckpts" / "last.ckpt"
    logger = logging.getLogger("lift3d")  # the CLI's logger does not propagate to the root: listen on it
    logger.addHandler(caplog.handler)
    try:
        code = main(["export", str(config), "--resume", str(checkpoint), "--format", "glb", "mesh-ply", "gif",
                     "system.export.resolution=20", *quiet])  # an override after --format still applies
    finally:
        logger.removeHandler(caplog.handler)
    assert code == 0
    assert "grid [20, 20, 20]" in caplog.text
    out = capsys.readouterr().out
    assert re.search(r"exported 3 file\(s\)", out)
    for name in ["it3.glb", "it3-mesh.ply", "it3-orbit.gif"]:
        path = run_dir / "save" / name
        assert path.is_file() and f"{path}  " in out
    # the checkpoint's trained radius (not the initial one) is what was meshed
    vertices = np.stack([PlyData.read(run_dir / "save" / "it3-mesh.ply")["vertex"][a] for a in "xyz"], 1)
    radius = float(torch.load(checkpoint, weights_only=True)["state_dict"]["radius"])
    assert radius != pytest.approx(0.4, abs=1e-3)
    assert np.abs(np.linalg.norm(vertices, axis=1) - radius).max() < 2.0 / 19


def test_gaussian_tensors_check_shapes():
    with pytest.raises(ValueError, match=r"scales must be \[3, 3\]"):
        GaussianTensors(torch.zeros(3, 3), torch.zeros(3, 2), torch.zeros(3, 4), torch.zeros(3))

"""Exports never overwrite each other: a converted file's name carries its source format (``lift3d.export.naming``)."""

import logging

import pytest

from lift3d.cli import main
from lift3d.export.formats import export_table
from lift3d.export.naming import converted_stem, export_name, file_endings
from lift3d.gaussians.formats.files import load_gaussian_file
from lift3d.gaussians.formats.gltf import save_gltf_splat
from lift3d.gaussians.formats.ply import save_ply
from lift3d.gaussians.formats.sog import save_sog
from lift3d.gaussians.formats.splat import write_splat
from lift3d.gaussians.formats.spz import save_spz
from lift3d.progress import Stage
from tests.export.test_gaussian_formats import tensors
from tests.gaussian_params import random_params

SMALL_MESH = ["system.export.resolution=24", "system.export.texture_size=64", "system.export.target_faces=0"]


def test_every_format_has_its_own_ending():
    endings = file_endings()
    assert set(endings) == set(export_table()) >= {"glb", "3dgs-ply", "gltf-splat", "mp4", "sog-lod"}
    assert len(set(endings.values())) == len(endings)
    assert converted_stem("a/model.SOG") == "model-sog" and export_name("model-sog", "3dgs-ply") == "model-sog-gaussians.ply"


def test_sog_and_splat_of_one_stem_convert_to_two_files(tmp_path):
    params = random_params(60, degree=1, seed=1)
    save_sog(tmp_path / "model.sog", params)
    write_splat(tmp_path / "model.splat", tensors(random_params(40, degree=0, seed=2)))
    for name in ("model.sog", "model.splat"):
        assert main(["export", str(tmp_path / name), "--format", "3dgs-ply"]) == 0
    from_sog, from_splat = (load_gaussian_file(tmp_path / f"model-{fmt}-gaussians.ply") for fmt in ("sog", "splat"))
    assert len(from_sog["means"]) == 60 and len(from_splat["means"]) == 40
    assert not (tmp_path / "model-gaussians.ply").exists()


def test_a_runs_ply_meshed_to_glb_keeps_the_runs_khr_glb(tmp_path):
    params = random_params(200, degree=1, seed=3)
    params["log_scales"] = params["log_scales"].clamp(-4, -2)  # overlapping blobs: a surface to mesh
    save_ply(tmp_path / "it1000-gaussians.ply", params)
    save_gltf_splat(tmp_path / "it1000-gaussians.glb", params)
    khr = (tmp_path / "it1000-gaussians.glb").read_bytes()
    assert main(["export", str(tmp_path / "it1000-gaussians.ply"), "--format", "glb", *SMALL_MESH]) == 0
    assert (tmp_path / "it1000-gaussians.glb").read_bytes() == khr
    assert (tmp_path / "it1000-gaussians-ply.glb").stat().st_size > 0


def test_a_runs_spz_converted_to_ply_keeps_the_runs_full_precision_ply(tmp_path):
    params = random_params(80, degree=2, seed=4)
    save_ply(tmp_path / "it1000-gaussians.ply", params)
    save_spz(tmp_path / "it1000.spz", params)
    full = (tmp_path / "it1000-gaussians.ply").read_bytes()
    assert main(["export", str(tmp_path / "it1000.spz"), "--format", "3dgs-ply"]) == 0
    assert (tmp_path / "it1000-gaussians.ply").read_bytes() == full
    decoded = load_gaussian_file(tmp_path / "it1000-spz-gaussians.ply")
    assert decoded["shN"].shape == (80, 8, 3)


def test_a_chosen_stem_that_names_the_source_is_refused(tmp_path, capsys):
    save_spz(tmp_path / "scan.spz", random_params(10, degree=0))
    before = (tmp_path / "scan.spz").read_bytes()
    assert main(["export", str(tmp_path / "scan.spz"), "--format", "spz", "system.export.stem=scan"]) == 2
    assert "would overwrite it" in capsys.readouterr().err
    assert (tmp_path / "scan.spz").read_bytes() == before


def test_a_stage_logs_its_start_progress_with_eta_and_end(caplog):
    with caplog.at_level(logging.INFO, logger="lift3d.progress"):
        with Stage("meshing: density", total=4, unit="blocks", every_s=0.0) as stage:
            for _ in range(4):
                stage.advance()
        with Stage("quick", total=2, unit="chunks", every_s=60.0) as stage:
            stage.advance(2)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "meshing: density (4 blocks)"
    assert lines[1].startswith("meshing: density: 1/4 blocks, 0 s, about 0 s left")
    assert lines[3].startswith("meshing: density: 3/4 blocks") and lines[4].startswith("meshing: density: done, 4/4 blocks")
    assert lines[5:] == ["quick (2 chunks)"]  # a quick stage costs one line


@pytest.mark.parametrize("fmt, stage", [("mp4", "video: rendering 32 x 24 (3 frames)"), ("glb", "meshing: density on a")])
def test_lift3d_export_shows_each_long_step(tmp_path, capsys, fmt, stage):
    params = random_params(100, degree=0, seed=5)
    params["log_scales"] = params["log_scales"].clamp(-4, -2)
    save_ply(tmp_path / "m.ply", params)
    assert main(["export", str(tmp_path / "m.ply"), "--format", fmt, *SMALL_MESH, "system.export.video_frames=3",
                 "system.export.video_width=32", "system.export.video_height=24"]) == 0
    assert stage in capsys.readouterr().err

"""Steps after training fail soft: a missing video writer costs the video, not the run or the other exports."""

import json
import sys

import numpy as np

from lift3d import aftercare
from lift3d.cli import main
from lift3d.saving import OutputSaver
from tests.validators import gltf_problems, validate_gltf

SHORT = ["trainer.max_steps=20", "trainer.val_check_interval=20", "data.n_orbit_views=3", "use_timestamp=false",
         "system.gaussians.init_points=600", "trainer.enable_progress_bar=false"]


def test_a_missing_ffmpeg_plugin_costs_only_the_videos(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # as if imageio-ffmpeg were not installed
    code = main(["reconstruct", f"output_root={tmp_path}", *SHORT, "system.export.formats=[3dgs-ply,mp4,splat]"])
    err = capsys.readouterr().err
    assert code == aftercare.EXIT_TRAINED_WITH_PROBLEMS, err
    assert "trained, but 2 step(s) after training failed" in err and "pip install imageio-ffmpeg" in err
    assert "Traceback" not in err
    run_dir = next((tmp_path / "reconstruct-gaussians-sample").iterdir())
    save = run_dir / "save"
    assert (save / "it20-gaussians.ply").is_file() and (save / "it20.splat").is_file()  # the other exports ran
    assert not list(save.glob("*.mp4")) and (run_dir / "ckpts" / "last.ckpt").is_file()
    progress = json.loads((run_dir / "progress.json").read_text())
    assert progress["status"] == "finished" and len(progress["problems"]) == 2
    assert json.loads((save / "metrics.json").read_text())["val"]["step"] == 20


def test_writers_report_what_is_missing(monkeypatch):
    assert aftercare.writer_status()["mp4"] == "ok"
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)
    assert "pip install imageio-ffmpeg" in aftercare.writer_status()["mp4"]
    frames = [np.zeros((4, 4, 3), np.uint8)] * 2
    aftercare.reset()
    assert aftercare.attempt("a video", OutputSaver("/nonexistent-unused").video, "x.mp4", frames) is None
    assert aftercare.problems() == ["a video failed: writing .mp4 needs imageio's FFMPEG plugin: pip install imageio-ffmpeg "
                                    "(or ask for gif instead)"]


def test_the_readme_export_line_works_on_a_reconstruction(tmp_path, capsys):
    """`lift3d export CONFIG --resume CKPT --format glb obj 3dgs-ply splat mp4` on a finished lift3d reconstruct run."""
    assert main(["reconstruct", f"output_root={tmp_path}", *SHORT, "system.export.formats=[]",
                 "trainer.run_test_after_fit=false"]) == 0
    run_dir = next((tmp_path / "reconstruct-gaussians-sample").iterdir())
    capsys.readouterr()
    code = main(["export", str(run_dir / "configs" / "parsed.yaml"), "--resume", str(run_dir / "ckpts" / "last.ckpt"),
                 "--format", "glb", "obj", "3dgs-ply", "splat", "mp4", "system.export.resolution=48",
                 "system.export.texture_size=64", "system.export.video_frames=4", "system.export.video_width=32",
                 "system.export.video_height=32"])
    out = capsys.readouterr()
    assert code == 0, out.err
    names = {p.name for p in (run_dir / "save").iterdir()}
    assert {"it20.glb", "it20.obj", "it20.mtl", "it20-gaussians.ply", "it20.splat", "it20-orbit.mp4"} <= names
    texture = [line.split()[-1] for line in (run_dir / "save" / "it20.mtl").read_text().splitlines() if line.startswith("map_Kd")]
    assert texture and (run_dir / "save" / texture[0]).is_file()  # the .obj's texture (trimesh names it by version)
    report = validate_gltf(run_dir / "save" / "it20.glb")[0]
    assert not [p for p in gltf_problems(report) if p[0] == "error"]
    assert main(["export", str(run_dir / "configs" / "parsed.yaml"), "--resume", str(run_dir / "ckpts" / "last.ckpt"),
                 "--format", "ply"]) == 2
    assert "ambiguous" in capsys.readouterr().err

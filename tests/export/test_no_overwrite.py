"""Exports never replace a file that lift3d did not write: beside a converted file and inside a run's save/ alike, a
file of someone else's (or one of lift3d's own, edited since) at an export's name stops that format with one line and
is left byte for byte as it was, unless ``--overwrite`` is given. lift3d knows its own earlier exports by the record
it keeps in the folder (sizes and SHA-256 digests in .lift3d-exports.json), not by their names."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lift3d.cli import main
from lift3d.gaussians.formats.splat import SPLAT_DTYPE
from lift3d.saving import MANIFEST, ExportRecord, OutputSaver, atomic_write_bytes
from tests.hostile import png_bytes, refused

# the files someone keeps beside their Gaussians, at the names lift3d's conversions would write
THEIRS = {"scene-splat.spz": b"NGSP my hand-tuned spz", "scene-splat-gaussians.ply": b"ply\nmy cleaned-up splats\n",
          "scene-splat.html": b"<html>my page</html>", "scene-splat-gaussians.glb": b"glTF my edit"}


def splat_file(path, n: int = 40) -> None:
    """A .splat as web viewers' converters write it (32-byte records, no header)."""
    rng = np.random.default_rng(0)
    records = np.zeros(n, dtype=SPLAT_DTYPE)
    records["position"] = rng.normal(size=(n, 3))
    records["scale"] = rng.uniform(0.02, 0.1, size=(n, 3))
    records["rgba"] = rng.integers(0, 256, size=(n, 4))
    records["rotation"] = [[255, 128, 128, 128]] * n
    path.write_bytes(records.tobytes())


def test_a_conversion_never_replaces_someone_elses_files_unless_told(tmp_path, capsys):
    splat_file(tmp_path / "scene.splat")
    for name, data in THEIRS.items():
        (tmp_path / name).write_bytes(data)
    formats = ["spz", "3dgs-ply", "html", "gltf-splat", "ksplat"]
    line = refused(["export", str(tmp_path / "scene.splat"), "--format", *formats], capsys, "scene-splat.spz",
                   "scene-splat-gaussians.ply", "scene-splat.html", "scene-splat-gaussians.glb", "--overwrite")
    assert "lift3d did not write it" in line
    for name, data in THEIRS.items():
        assert (tmp_path / name).read_bytes() == data, name
    assert (tmp_path / "scene-splat.ksplat").is_file()  # no one's file was in its way: written, and recorded
    assert ExportRecord(tmp_path).owns(tmp_path / "scene-splat.ksplat")

    # lift3d's own earlier export is replaced without a word; an edit of it makes it someone's
    assert main(["export", str(tmp_path / "scene.splat"), "--format", "ksplat"]) == 0, capsys.readouterr().err
    with open(tmp_path / "scene-splat.ksplat", "ab") as handle:
        handle.write(b"\0")
    edited = (tmp_path / "scene-splat.ksplat").read_bytes()
    refused(["export", str(tmp_path / "scene.splat"), "--format", "ksplat"], capsys, "scene-splat.ksplat")
    assert (tmp_path / "scene-splat.ksplat").read_bytes() == edited

    # --overwrite replaces them all, and from then on they are lift3d's
    assert main(["export", str(tmp_path / "scene.splat"), "--format", *formats, "--overwrite"]) == 0, capsys.readouterr().err
    assert all((tmp_path / name).read_bytes() != data for name, data in THEIRS.items())
    assert main(["export", str(tmp_path / "scene.splat"), "--format", *formats]) == 0, capsys.readouterr().err
    record = json.loads((tmp_path / MANIFEST).read_text())["files"]
    assert {"scene-splat.spz", "scene-splat.ksplat", "scene-splat-gaussians.glb"} <= set(record)


def test_a_symlink_or_a_folder_at_an_exports_name_is_not_followed(tmp_path, capsys):
    splat_file(tmp_path / "scene.splat")
    target = tmp_path / "elsewhere.txt"
    target.write_text("someone's file the link points to")
    (tmp_path / "scene-splat.spz").symlink_to(target)
    (tmp_path / "scene-splat-gaussians.ply").mkdir()
    refused(["export", str(tmp_path / "scene.splat"), "--format", "spz", "3dgs-ply"], capsys, "scene-splat.spz",
            "is a folder")
    assert (tmp_path / "scene-splat.spz").is_symlink() and target.read_text() == "someone's file the link points to"


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory):
    """A two-step sample reconstruction that exported its Gaussians (.ply, .splat) at the end of training."""
    root = tmp_path_factory.mktemp("no-overwrite")
    assert main(["reconstruct", f"output_root={root}", "trainer.max_steps=2", "trainer.val_check_interval=0",
                 "trainer.run_test_after_fit=false", "system.export.formats=[3dgs-ply,splat]", "use_timestamp=false",
                 "trainer.enable_progress_bar=false"]) == 0
    return root / "reconstruct-gaussians-sample" / "sample_scene"


# format -> (the file it writes in a run's save/, someone's file at that name)
RUN_FILES = {
    "glb": ("it2.glb", b"glTF someone's retopologized mesh"), "obj": ("it2.obj", b"o my_edit\nv 0 0 0\n"),
    "mesh-ply": ("it2-mesh.ply", b"ply\nmy mesh\n"), "spz": ("it2.spz", b"my spz"), "sog": ("it2.sog", b"PK my sog"),
    "ksplat": ("it2.ksplat", b"my ksplat"), "gltf-splat": ("it2-gaussians.glb", b"glTF my splats"),
    "html": ("it2.html", b"<html>my page</html>"), "sog-lod": ("it2-lod/lod-meta.json", b"{\"mine\": true}"),
    "gif": ("it2-orbit.gif", png_bytes()), "mp4": ("it2-orbit.mp4", b"my cut of the orbit"),
}


def test_a_runs_exports_replace_its_own_files_and_no_one_elses(exported_run, capsys):
    save = exported_run / "save"
    ours = {name: (save / name).read_bytes() for name in ("it2-gaussians.ply", "it2.splat")}
    # what training exported is lift3d's: exported again, it is replaced without a word
    assert main(["export", str(exported_run), "--format", "3dgs-ply", "splat"]) == 0, capsys.readouterr().err
    assert ExportRecord(save).owns(save / "it2-gaussians.ply") and ExportRecord(save).owns(save / "it2.splat")
    assert set(ours) <= set(json.loads((save / MANIFEST).read_text())["files"])

    for name, data in RUN_FILES.values():
        (save / name).parent.mkdir(parents=True, exist_ok=True)
        (save / name).write_bytes(data)
    small = ["system.export.resolution=32", "system.export.video_frames=2", "system.export.video_width=32",
             "system.export.video_height=32", "system.export.texture_size=0", "system.export.lod_levels=1"]
    line = refused(["export", str(exported_run), "--format", *RUN_FILES, *small], capsys, "--overwrite", seconds=600)
    for fmt, (name, data) in RUN_FILES.items():
        assert (save / name).read_bytes() == data, fmt
        assert name.split("/")[0] in line, (fmt, line)


def test_the_saver_guards_only_inside_an_export(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    saver = OutputSaver(tmp_path)
    atomic_write_bytes(tmp_path / "notes.txt", b"a checkpoint or a cache writes as before")
    (tmp_path / "notes.txt").write_text("mine")
    with saver.exporting(), pytest.raises(FileExistsError, match="notes.txt exists and lift3d did not write it"):
        atomic_write_bytes(tmp_path / "notes.txt", b"an export")
    assert (tmp_path / "notes.txt").read_text() == "mine"
    with OutputSaver(tmp_path, overwrite=True).exporting():
        atomic_write_bytes(tmp_path / "notes.txt", b"an export")
    assert ExportRecord(tmp_path).owns(tmp_path / "notes.txt")

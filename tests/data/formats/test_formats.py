"""The table of capture formats (``lift3d.data.formats``): discovered from its modules, and the one source of
detection, data.format's choices and the format lists in help and error texts."""

from __future__ import annotations

import pytest

from lift3d.data import formats
from lift3d.data.capture import SceneFormatError
from lift3d.data.scene import detect, read_capture

BUILT_IN = ["blender", "transforms", "colmap", "photos", "video"]  # a new format adds to the table, changing none of these


def test_the_table_holds_every_format_in_priority_order():
    table = formats.formats()
    assert [f.name for f in table if f.name in BUILT_IN] == BUILT_IN
    assert [f.priority for f in table] == sorted(f.priority for f in table)
    assert formats.config_names()[:5] == ("auto", "blender", "nerfstudio", "instant-ngp", "colmap")
    assert [f.name for f in table if f.object_centric and f.name in BUILT_IN] == ["blender"]
    assert all(f.description for f in table)


def test_each_format_is_detected(tmp_path, data_dir):
    assert formats.detect(data_dir / "lego_tiny").name == "blender"
    (tmp_path / "ngp").mkdir()
    (tmp_path / "ngp" / "transforms.json").write_text("{}")
    assert formats.detect(tmp_path / "ngp").name == "transforms"
    (tmp_path / "col" / "sparse" / "0").mkdir(parents=True)
    (tmp_path / "col" / "sparse" / "0" / "cameras.txt").write_text("")
    assert formats.detect(tmp_path / "col").name == "colmap"
    (tmp_path / "photos" / "images").mkdir(parents=True)
    (tmp_path / "photos" / "images" / "a.jpg").write_bytes(b"")
    assert formats.detect(tmp_path / "photos").name == "photos"
    assert formats.detect(tmp_path / "photos", posed_only=True) is None
    (tmp_path / "clip.mp4").write_bytes(b"")
    assert formats.detect(tmp_path / "clip.mp4").name == "video"
    assert formats.detect(tmp_path / "empty") is None


def test_errors_and_help_list_the_table(tmp_path):
    from lift3d.commands.reconstruct import HELP

    with pytest.raises(SceneFormatError) as error:
        detect(tmp_path)
    for record in formats.formats():
        assert record.description in str(error.value)
        assert record.description in HELP
    with pytest.raises(SceneFormatError, match="data.format must be one of auto, blender, nerfstudio, instant-ngp, colmap"):
        read_capture(tmp_path, "llff")
    (tmp_path / "clip.mp4").write_bytes(b"")
    with pytest.raises(SceneFormatError, match="is not a video lift3d can read"):
        detect(tmp_path / "clip.mp4")


def test_a_colmap_capture_changes_downscale_without_being_read_again(tmp_path, monkeypatch):
    """images_<n>/ is picked again from the frames read once (the model is not parsed a second time)."""
    import numpy as np
    from PIL import Image

    from lift3d.data.colmap_model import ColmapCamera, ColmapImage, ColmapModel, write_model_binary
    from lift3d.data.formats import colmap
    from lift3d.data.scene import rescale_capture

    model = ColmapModel({1: ColmapCamera(1, "PINHOLE", 8, 8, np.array([8.0, 8.0, 4.0, 4.0]))},
                        {i: ColmapImage(i, np.array([1.0, 0, 0, 0]), np.array([0.0, 0, i]), 1, f"{i}.png")
                         for i in (1, 2)}, {})
    write_model_binary(model, tmp_path / "sparse" / "0")
    for folder, size in (("images", 8), ("images_2", 4)):
        (tmp_path / folder).mkdir()
        for i in (1, 2):
            Image.new("RGB", (size, size)).save(tmp_path / folder / f"{i}.png")
    capture, left = read_capture(tmp_path, "auto", 1)
    assert left == 1 and capture.frames[0].image == tmp_path / "images" / "1.png"
    monkeypatch.setattr(colmap, "read_model", lambda folder: pytest.fail("the model was read again"))
    rescaled, left = rescale_capture(capture, 2)
    assert left == 1 and [f.image for f in rescaled.frames] == [tmp_path / "images_2" / f"{i}.png" for i in (1, 2)]
    assert rescaled.notes[0].endswith(f"images from {tmp_path / 'images_2'}")
    rescaled, left = rescale_capture(capture, 4)  # no images_4/: images/ read at a quarter
    assert left == 4 and rescaled.frames[0].image == tmp_path / "images" / "1.png"

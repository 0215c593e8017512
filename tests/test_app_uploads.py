"""Posed-image uploads: safe unzip, folder uploads without sub-folders, and checks before a run starts."""

import json
import shutil
import stat
import zipfile

import pytest

from lift3d.app.uploads import UploadError, prepare_scene, safe_extract_zip


def _zip_folder(folder, archive, prefix=""):
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                zf.write(path, prefix + str(path.relative_to(folder)))
    return archive


def test_zip_of_a_scene_folder_is_unpacked_and_checked(tmp_path, data_dir):
    archive = _zip_folder(data_dir / "lego_tiny", tmp_path / "lego.zip", prefix="lego_tiny/")
    scene = prepare_scene([archive], tmp_path / "scene")
    assert scene.root == tmp_path / "scene" / "lego_tiny"
    assert scene.frames == {"train": 1, "val": 1}
    assert (scene.width, scene.height) == (50, 50)
    assert (scene.root / "val" / "r_0.png").read_bytes() == (data_dir / "lego_tiny" / "val" / "r_0.png").read_bytes()
    assert scene.summary() == "1 train, 1 val views at 50x50"


@pytest.mark.parametrize("member", ["../escape.txt", "/abs/escape.txt", "ok/../../escape.txt", "C:/escape.txt", "..\\escape.txt"])
def test_zip_with_path_traversal_is_refused_before_writing(tmp_path, member):
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("transforms_train.json", "{}")
        zf.writestr(member, "pwned")
    with pytest.raises(UploadError, match="unsafe path"):
        safe_extract_zip(archive, tmp_path / "out" / "scene")
    assert not (tmp_path / "out").exists() and not (tmp_path / "escape.txt").exists()


def test_zip_with_a_symlink_is_refused(tmp_path):
    archive = tmp_path / "link.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        info = zipfile.ZipInfo("train/r_0.png")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(UploadError, match="symbolic link"):
        prepare_scene([archive], tmp_path / "scene")


def test_malformed_uploads_say_what_is_wrong(tmp_path, data_dir):
    (tmp_path / "fake.zip").write_bytes(b"not a zip at all")
    with pytest.raises(UploadError, match="not a readable .zip"):
        prepare_scene([tmp_path / "fake.zip"], tmp_path / "a")
    with pytest.raises(UploadError, match="upload photos"):
        prepare_scene([], tmp_path / "b")
    # an archive of one photo without poses: too few for structure from motion
    empty = tmp_path / "images"
    empty.mkdir()
    shutil.copyfile(data_dir / "lego_tiny" / "train" / "r_0.png", empty / "r_0.png")
    with pytest.raises(UploadError, match="holds 1 photo.*structure from motion needs many"):
        prepare_scene([_zip_folder(empty, tmp_path / "images.zip")], tmp_path / "c")
    (tmp_path / "notes.txt").write_text("no photos here")
    with pytest.raises(UploadError, match="no photos and no transforms_train.json"):
        prepare_scene([tmp_path / "notes.txt"], tmp_path / "c2")
    # a transforms file whose frame has no image: the scene reader's message, with the temp path hidden
    broken = tmp_path / "broken"
    shutil.copytree(data_dir / "lego_tiny", broken)
    (broken / "val" / "r_0.png").unlink()
    with pytest.raises(UploadError, match=r"1 of 2 frames listed in the upload have no image file: ./val/r_0"):
        prepare_scene([_zip_folder(broken, tmp_path / "broken.zip")], tmp_path / "d")
    (broken / "transforms_train.json").write_text("{ not json")
    with pytest.raises(UploadError, match="not valid JSON"):
        prepare_scene([_zip_folder(broken, tmp_path / "broken2.zip")], tmp_path / "e")


def test_folder_upload_without_subfolders_is_rebuilt(tmp_path, data_dir):
    # a browser uploads a folder's files by name only: transforms_train.json and r_0.png
    flat = tmp_path / "flat"
    flat.mkdir()
    shutil.copyfile(data_dir / "lego_tiny" / "transforms_train.json", flat / "transforms_train.json")
    shutil.copyfile(data_dir / "lego_tiny" / "train" / "r_0.png", flat / "r_0.png")
    scene = prepare_scene([flat / "transforms_train.json", flat / "r_0.png"], tmp_path / "scene")
    assert scene.frames == {"train": 1}
    frame = json.loads((scene.root / "transforms_train.json").read_text())["frames"][0]["file_path"]
    assert frame == "./train/r_0" and (scene.root / "train" / "r_0.png").is_file()


def test_folder_upload_with_clashing_names_asks_for_a_zip(tmp_path, data_dir):
    files = []
    for split in ("train", "val"):
        (tmp_path / split).mkdir()
        files.append(shutil.copyfile(data_dir / "lego_tiny" / split / "r_0.png", tmp_path / split / "r_0.png"))
        files.append(shutil.copyfile(data_dir / "lego_tiny" / f"transforms_{split}.json", tmp_path / f"transforms_{split}.json"))
    with pytest.raises(UploadError, match="upload a .zip"):
        prepare_scene(files, tmp_path / "scene")
    with pytest.raises(UploadError, match="not several"):
        prepare_scene([*files, _zip_folder(data_dir / "lego_tiny", tmp_path / "lego.zip")], tmp_path / "scene2")


def test_photos_videos_and_other_layouts_are_accepted(tmp_path):
    """Photos without poses (loose or zipped), a video, and a COLMAP scene: the scene and what SfM must do first."""
    import imageio.v2 as imageio
    import numpy as np

    from lift3d.data.colmap_model import ColmapCamera, ColmapImage, ColmapModel, write_model_binary

    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    files = []
    for i in range(3):
        files.append(photos / f"p{i}.jpg")
        imageio.imwrite(files[-1], rng.integers(0, 255, (30, 40, 3), dtype=np.uint8))
    loose = prepare_scene(files, tmp_path / "loose")
    assert loose.frames == {"photos": 3} and loose.poses_from == loose.root and (loose.root / "images" / "p0.jpg").is_file()
    assert "poses by structure from motion" in loose.summary() and (loose.width, loose.height) == (40, 30)
    zipped = prepare_scene([_zip_folder(photos, tmp_path / "photos.zip")], tmp_path / "zipped")
    assert zipped.poses_from == zipped.root and zipped.frames == {"photos": 3}

    video = tmp_path / "clip.mp4"
    imageio.mimwrite(video, [rng.integers(0, 255, (32, 48, 3), dtype=np.uint8) for _ in range(4)], fps=4, macro_block_size=16)
    scene = prepare_scene([video], tmp_path / "video")
    assert scene.poses_from == tmp_path / "video" / "clip.mp4" and scene.root == tmp_path / "video" / "clip"
    assert (scene.width, scene.height) == (48, 32) and "a video" in scene.summary()
    (tmp_path / "bad.mp4").write_text("not a video")
    with pytest.raises(UploadError, match="not a readable video"):
        prepare_scene([tmp_path / "bad.mp4"], tmp_path / "bad")

    colmap = tmp_path / "colmap_scene"
    shutil.copytree(photos, colmap / "images")
    images = {i + 1: ColmapImage(i + 1, np.array([1.0, 0, 0, 0]), np.array([float(i), 0, 0]), 1, f"p{i}.jpg") for i in range(3)}
    write_model_binary(ColmapModel({1: ColmapCamera(1, "PINHOLE", 40, 30, np.array([30.0, 30, 20, 15]))}, images, {}),
                       colmap / "sparse" / "0")
    posed = prepare_scene([_zip_folder(colmap, tmp_path / "colmap.zip")], tmp_path / "posed")
    assert posed.poses_from is None and posed.frames == {"train": 2, "val": 1} and (posed.width, posed.height) == (40, 30)

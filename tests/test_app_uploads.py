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
    with pytest.raises(UploadError, match="upload the posed photos"):
        prepare_scene([], tmp_path / "b")
    # an archive without transforms
    empty = tmp_path / "images"
    empty.mkdir()
    shutil.copyfile(data_dir / "lego_tiny" / "train" / "r_0.png", empty / "r_0.png")
    with pytest.raises(UploadError, match="no transforms_train.json"):
        prepare_scene([_zip_folder(empty, tmp_path / "images.zip")], tmp_path / "c")
    # a transforms file whose frame has no image: the scene reader's message, with the temp path hidden
    broken = tmp_path / "broken"
    shutil.copytree(data_dir / "lego_tiny", broken)
    (broken / "val" / "r_0.png").unlink()
    with pytest.raises(UploadError, match=r"1 of 1 frames listed in the upload/transforms_val.json have no image file"):
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
    with pytest.raises(UploadError, match="not both"):
        prepare_scene([*files, _zip_folder(data_dir / "lego_tiny", tmp_path / "lego.zip")], tmp_path / "scene2")

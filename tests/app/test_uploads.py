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


# --------------------------------------------------------------------------------------------- the trust boundary
def _server_photo(tmp_path, data_dir):
    """A photo elsewhere on the server, which an uploaded scene must not reach."""
    secret = tmp_path / "server" / "secret.png"
    secret.parent.mkdir(parents=True)
    shutil.copyfile(data_dir / "lego_tiny" / "train" / "r_0.png", secret)
    return secret


@pytest.mark.parametrize("how", ["absolute", "dotdot", "mask"])
def test_a_transforms_scene_naming_files_outside_the_upload_is_refused(tmp_path, data_dir, how):
    secret = _server_photo(tmp_path, data_dir)
    scene = tmp_path / "scene"
    shutil.copytree(data_dir / "lego_tiny", scene)
    meta = json.loads((scene / "transforms_train.json").read_text())
    named = {"absolute": str(secret.with_suffix("")), "dotdot": "../../../../../../../../" + str(secret)[1:],
             "mask": "./train/r_0"}[how]
    meta["frames"][0]["file_path"] = named
    if how == "mask":
        meta["frames"][0]["mask_path"] = named = str(secret)
    (scene / "transforms_train.json").write_text(json.dumps(meta))
    dest = tmp_path / "uploads" / "one"
    with pytest.raises(UploadError, match="names files outside itself") as error:
        prepare_scene([_zip_folder(scene, tmp_path / "scene.zip")], dest)
    assert f"'{named}'" in str(error.value)  # the offending path, as the file wrote it
    assert not dest.exists()  # and nothing of the rejected upload stays
    # the same scene as a browser folder upload (files without sub-folders) is refused too
    with pytest.raises(UploadError, match="outside"):
        prepare_scene([scene / "transforms_train.json", scene / "train" / "r_0.png"], tmp_path / "uploads" / "two")
    assert not (tmp_path / "uploads" / "two").exists()


def test_transforms_json_and_colmap_names_outside_the_upload_are_refused(tmp_path, data_dir):
    import numpy as np

    from lift3d.data.colmap_model import ColmapCamera, ColmapImage, ColmapModel, write_model_binary

    secret = _server_photo(tmp_path, data_dir)
    ngp = tmp_path / "ngp"
    (ngp / "images").mkdir(parents=True)
    shutil.copyfile(secret, ngp / "images" / "a.png")
    frame = {"transform_matrix": np.eye(4).tolist()}
    (ngp / "transforms.json").write_text(json.dumps({"fl_x": 50, "fl_y": 50, "w": 50, "h": 50, "frames": [
        {**frame, "file_path": "images/a.png"}, {**frame, "file_path": "images/../../../server/secret.png"}]}))
    with pytest.raises(UploadError, match=r"outside itself: 'images/\.\./\.\./\.\./server/secret\.png'"):
        prepare_scene([_zip_folder(ngp, tmp_path / "ngp.zip")], tmp_path / "u1")
    meta = json.loads((ngp / "transforms.json").read_text())
    meta["frames"][1]["file_path"], meta["ply_file_path"] = "images/a.png", "/etc/passwd"
    (ngp / "transforms.json").write_text(json.dumps(meta))
    with pytest.raises(UploadError, match="'/etc/passwd'"):
        prepare_scene([_zip_folder(ngp, tmp_path / "ngp2.zip")], tmp_path / "u2")

    colmap = tmp_path / "colmap"
    (colmap / "images").mkdir(parents=True)
    for i in range(3):
        shutil.copyfile(secret, colmap / "images" / f"p{i}.png")
    names = ["p0.png", "p1.png", str(secret)]
    images = {i + 1: ColmapImage(i + 1, np.array([1.0, 0, 0, 0]), np.array([float(i), 0, 0]), 1, names[i]) for i in range(3)}
    write_model_binary(ColmapModel({1: ColmapCamera(1, "PINHOLE", 50, 50, np.array([40.0, 40, 25, 25]))}, images, {}),
                       colmap / "sparse" / "0")
    with pytest.raises(UploadError, match=f"'{secret}'"):
        prepare_scene([_zip_folder(colmap, tmp_path / "colmap.zip")], tmp_path / "u3")
    assert not any((tmp_path / name).exists() for name in ("u1", "u2", "u3"))


@pytest.fixture(scope="module")
def zip_bomb(tmp_path_factory):
    """A 1.1 MB zip of one member that inflates to 1.1 GiB of zeros (deflated: small on disk, huge unpacked)."""
    path = tmp_path_factory.mktemp("bomb") / "photos.zip"
    zeros = bytes(16 * 2**20)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("transforms_train.json", "{}")
        with zf.open("train/r_0.png", "w", force_zip64=True) as member:
            for _ in range(70):  # 70 x 16 MiB = 1.09 GiB
                member.write(zeros)
    return path


def test_a_zip_bomb_is_refused_before_writing_and_leaves_nothing(tmp_path, zip_bomb):
    assert zip_bomb.stat().st_size < 2 * 2**20
    with zipfile.ZipFile(zip_bomb) as zf:
        assert sum(m.file_size for m in zf.infolist()) > 2**30
    dest = tmp_path / "app-uploads" / "abc"
    with pytest.raises(UploadError, match=r"more than 100 times its packed size"):
        prepare_scene([zip_bomb], dest)
    assert not dest.exists() and not (tmp_path / "app-uploads").exists()
    with pytest.raises(UploadError,
                       match=r"unpacks to 1\.\d\d GiB, more than this app accepts \(1\.0 MiB; lift3d app --max-upload-gb"):
        safe_extract_zip(zip_bomb, dest, max_bytes=2**20)
    assert not dest.exists()


def test_the_cap_is_configurable_and_a_failure_late_in_unpacking_cleans_up(tmp_path, data_dir):
    archive = _zip_folder(data_dir / "lego_tiny", tmp_path / "lego.zip")
    unpacked = sum(p.stat().st_size for p in (data_dir / "lego_tiny").rglob("*") if p.is_file())
    with pytest.raises(UploadError, match="more than this app accepts"):
        prepare_scene([archive], tmp_path / "small", max_bytes=unpacked - 1)
    assert not (tmp_path / "small").exists()
    assert prepare_scene([archive], tmp_path / "fits", max_bytes=unpacked).frames == {"train": 1, "val": 1}
    loose = [data_dir / "lego_tiny" / "train" / "r_0.png", data_dir / "lego_tiny" / "val" / "r_0.png"]
    with pytest.raises(UploadError, match="more than this app accepts"):
        prepare_scene(loose, tmp_path / "loose", max_bytes=100)
    # a scene that unpacks fine but fails its check (a frame without its image) leaves nothing either
    broken = tmp_path / "broken"
    shutil.copytree(data_dir / "lego_tiny", broken)
    (broken / "val" / "r_0.png").unlink()
    dest = tmp_path / "uploads" / "x"
    dest.mkdir(parents=True)
    (dest / "kept.txt").write_text("was here before")
    with pytest.raises(UploadError, match="have no image file"):
        prepare_scene([_zip_folder(broken, tmp_path / "broken.zip")], dest)
    assert [p.name for p in dest.iterdir()] == ["kept.txt"]

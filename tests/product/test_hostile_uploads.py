"""Uploads to the web app as broken tools and attackers make them: a zip whose member fails its checksum, a member
name too long for any disk, a file and a folder of one name, a video ffmpeg cannot read, a photo whose header claims
a decompression bomb. Each is an UploadError of one line that names the problem and the fix (the page shows it),
never an internal error, and leaves nothing behind."""

from __future__ import annotations

import zipfile

import pytest

from lift3d.app.uploads import UploadError, prepare_scene
from tests.hostile import forged_png, jpeg_bytes


def _refused(uploads, dest, *expected: str) -> str:
    with pytest.raises(UploadError) as caught:
        prepare_scene(uploads, dest)
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message, message
    for text in expected:
        assert text in message, (text, message)
    assert not dest.exists(), "a refused upload leaves nothing behind"
    return message


def _photos_zip(path, extra: dict[str, bytes] | None = None, stored: bool = True):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED) as archive:
        for i in range(3):
            archive.writestr(f"scan/images/img_{i}.jpg", jpeg_bytes(seed=i))
        for name, data in (extra or {}).items():
            archive.writestr(name, data)
    return path


def test_a_zip_member_that_fails_its_checksum_is_named(tmp_path):
    archive = _photos_zip(tmp_path / "photos.zip")
    data = bytearray(archive.read_bytes())
    at = data.index(jpeg_bytes(seed=1)[-200:-160])  # inside img_1.jpg's stored scan
    data[at] ^= 0xFF  # one flipped bit pattern: the stream unpacks, its CRC-32 does not match
    archive.write_bytes(bytes(data))
    _refused([archive], tmp_path / "upload", "photos.zip is damaged", "img_1.jpg", "zip the scene folder again")


def test_names_too_long_and_file_folder_clashes_are_named(tmp_path):
    long_name = "scan/images/" + "x" * 300 + ".jpg"
    archive = _photos_zip(tmp_path / "long.zip", {long_name: jpeg_bytes(seed=9)})
    _refused([archive], tmp_path / "upload", "long.zip", "xxxx", "shorten the file and folder names")
    clash = tmp_path / "clash.zip"
    with zipfile.ZipFile(clash, "w") as zf:
        zf.writestr("scan/images", b"a file where a folder goes")
        zf.writestr("scan/images/img_0.jpg", jpeg_bytes())
    _refused([clash], tmp_path / "upload", "clash.zip", "scan/images/img_0.jpg", "a file and a folder of one name")


def test_an_unreadable_video_is_named_without_ffmpegs_banner(tmp_path):
    (tmp_path / "clip.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(2000))  # a header, and nothing playable
    message = _refused([tmp_path / "clip.mp4"], tmp_path / "upload", "clip.mp4 is not a readable video", "upload an .mp4")
    assert "ffmpeg version" not in message and "configuration:" not in message and len(message) < 600, message


def test_a_photo_bomb_in_an_upload_is_named(tmp_path):
    archive = _photos_zip(tmp_path / "bomb.zip", {"scan/images/a_bomb.png": forged_png(100_000, 100_000)})
    _refused([archive], tmp_path / "upload", "a_bomb.png", "100000 x 100000 px", "LIFT3D_MAX_PHOTO_PIXELS")

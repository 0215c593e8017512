"""Posed-image uploads for reconstruction: a .zip (unpacked safely) or a folder's files, checked before a run.

A scene is the Blender / NeRF-synthetic layout: ``transforms_<split>.json`` files whose frames name images
by relative path. Browsers upload a folder's files without their sub-folders, so a folder upload is
rebuilt by matching each frame's file name; a .zip keeps the layout exactly.
"""

from __future__ import annotations

import json
import shutil
import stat
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from lift3d.data.posed_images import IMAGE_SUFFIXES, SceneFormatError, read_transforms

MAX_ZIP_BYTES = 8 * 2**30  # refuse archives that unpack to more than this
MAX_ZIP_MEMBERS = 100_000  # refuse archives with more entries than this
_SKIPPED = ("__MACOSX",)  # archive folders that are never scene data


class UploadError(ValueError):
    """An upload that is not a usable scene; the message says what is wrong and how to fix it."""


@dataclass(frozen=True)
class Scene:
    """A checked scene folder and what it holds."""

    root: Path  # the folder holding transforms_train.json
    frames: dict[str, int]  # split -> number of frames
    width: int
    height: int

    def summary(self) -> str:
        splits = ", ".join(f"{n} {split}" for split, n in self.frames.items())
        return f"{splits} views at {self.width}x{self.height}"


def _member_parts(name: str, archive: Path) -> tuple[str, ...]:
    """The path parts of an archive member; absolute paths, drives and '..' are refused."""
    posix = PurePosixPath(name.replace("\\", "/"))
    parts = tuple(p for p in posix.parts if p not in ("", "."))
    if posix.is_absolute() or (parts and ":" in parts[0]) or ".." in parts:
        raise UploadError(f"{archive.name} holds an unsafe path '{name}' (absolute or with '..'); "
                          "zip the scene folder itself, with paths relative to it")
    return parts


def safe_extract_zip(archive: str | Path, dest: str | Path) -> None:
    """Unpack ``archive`` into ``dest``, refusing path traversal, links and archive bombs."""
    archive, dest = Path(archive), Path(dest)
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as error:
        raise UploadError(f"{archive.name} is not a readable .zip archive ({error}); zip the scene folder again") from None
    with zf:
        members = zf.infolist()
        if len(members) > MAX_ZIP_MEMBERS:
            raise UploadError(f"{archive.name} has {len(members)} entries (at most {MAX_ZIP_MEMBERS})")
        if sum(m.file_size for m in members) > MAX_ZIP_BYTES:
            raise UploadError(f"{archive.name} unpacks to more than {MAX_ZIP_BYTES / 2**30:.0f} GiB")
        plan = []
        for member in members:
            parts = _member_parts(member.filename, archive)
            if stat.S_ISLNK(member.external_attr >> 16):
                raise UploadError(f"{archive.name} holds a symbolic link '{member.filename}'; links are not unpacked")
            if parts and parts[0] not in _SKIPPED:
                plan.append((member, parts))
        dest.mkdir(parents=True, exist_ok=True)
        root = dest.resolve()
        for member, parts in plan:
            target = dest.joinpath(*parts)
            if not target.resolve().is_relative_to(root):  # belt and braces: nothing lands outside dest
                raise UploadError(f"{archive.name}: '{member.filename}' would unpack outside the upload folder")
            if member.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as source, open(target, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)


def find_scene_root(folder: Path) -> Path:
    """The shallowest folder under ``folder`` holding ``transforms_train.json``."""
    found = sorted(folder.rglob("transforms_train.json"), key=lambda p: (len(p.parts), str(p)))
    found = [p for p in found if _SKIPPED[0] not in p.parts]
    if not found:
        others = sorted(p.name for p in folder.rglob("transforms_*.json"))
        raise UploadError(
            "the upload has no transforms_train.json"
            + (f" (found {', '.join(others)})" if others else "")
            + ". A scene holds transforms_train.json (and optionally transforms_val.json, transforms_test.json) "
            "with the images its frames list, as in NeRF-synthetic (Blender layout)."
        )
    if len(found) > 1 and len(found[1].parts) == len(found[0].parts):
        raise UploadError(f"the upload holds several scenes ({found[0].parent.name}, {found[1].parent.name}); upload one")
    return found[0].parent


def _image_index(files: Sequence[Path]) -> dict[str, list[Path]]:
    index: dict[str, list[Path]] = {}
    for path in files:
        if path.suffix in IMAGE_SUFFIXES:
            index.setdefault(path.name, []).append(path)
            index.setdefault(path.stem, []).append(path)
    return index


def assemble_flat_files(files: Sequence[Path], dest: Path) -> Path:
    """Rebuild a scene folder from files uploaded without their sub-folders (a browser folder upload)."""
    transforms = [f for f in files if f.name.startswith("transforms_") and f.suffix == ".json"]
    if not transforms:
        raise UploadError("the uploaded files include no transforms_train.json; upload the scene folder or a .zip of it")
    index = _image_index(files)
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    for source in transforms:
        shutil.copyfile(source, dest / source.name)
        try:
            frames = json.loads(source.read_text()).get("frames") or []
        except (json.JSONDecodeError, AttributeError) as error:
            raise UploadError(f"{source.name} is not a valid transforms file: {error}") from None
        for frame in frames:
            file_path = str(frame.get("file_path", "")) if isinstance(frame, dict) else ""
            name = PurePosixPath(file_path.replace("\\", "/")).name
            matches = sorted(set(index.get(name, [])))
            if len(matches) > 1:
                raise UploadError(
                    f"{len(matches)} uploaded images are named like '{name}' (frames of {source.name} live in "
                    "sub-folders that a browser folder upload drops); upload a .zip of the scene folder instead"
                )
            if not matches:
                continue  # read_transforms lists every missing image at once
            target = dest / file_path
            if PurePosixPath(file_path).suffix not in IMAGE_SUFFIXES:
                target = target.with_name(target.name + matches[0].suffix)
            if not target.resolve().is_relative_to(root):
                raise UploadError(f"{source.name}: frame path '{file_path}' points outside the scene folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(matches[0], target)
    return find_scene_root(dest)


def check_scene(root: Path) -> Scene:
    """Read every split of the scene (cameras and images); SceneFormatError says what is malformed."""
    splits = sorted(p.name[len("transforms_"):-len(".json")] for p in root.glob("transforms_*.json"))
    frames, size = {}, None
    for split in ["train"] + [s for s in splits if s != "train"]:
        scene = read_transforms(root, split)
        frames[split] = len(scene)
        size = size or (scene.cameras.width, scene.cameras.height)
    assert size is not None
    return Scene(root, frames, size[0], size[1])


def prepare_scene(uploads: Sequence[str | Path], dest: str | Path) -> Scene:
    """A checked scene folder under ``dest`` from uploaded files: one .zip, or a folder's files."""
    files = [Path(u) for u in uploads or []]
    if not files:
        raise UploadError("upload the posed photos: a .zip of the scene folder (transforms_train.json + images) or the folder")
    dest = Path(dest)
    zips = [f for f in files if f.suffix.lower() == ".zip"]
    if zips:
        if len(files) > 1:
            raise UploadError("upload either one .zip of the scene folder or the folder's files, not both")
        safe_extract_zip(zips[0], dest)
        root = find_scene_root(dest)
    else:
        root = assemble_flat_files(files, dest)
    try:
        return check_scene(root)
    except SceneFormatError as error:
        raise UploadError(str(error).replace(str(root), "the upload")) from None

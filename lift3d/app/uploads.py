"""Photo uploads for reconstruction, checked before a run: a .zip (unpacked safely), a folder's files, or a video.

A .zip may hold a posed scene in any layout lift3d reads (Blender ``transforms_<split>.json``, nerfstudio /
instant-ngp ``transforms.json``, a COLMAP ``sparse/`` model beside ``images/``) or just photos; photos
without poses and videos get their cameras from structure from motion (``lift3d poses``) as the run's
first stage. Browsers upload a folder's files without their sub-folders, so a Blender folder upload is
rebuilt by matching each frame's file name, and loose photos are gathered into ``images/``.
"""

from __future__ import annotations

import json
import shutil
import stat
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from lift3d.data.posed_images import IMAGE_SUFFIXES, SceneFormatError
from lift3d.data.scene import VIDEO_SUFFIXES

MAX_ZIP_BYTES = 8 * 2**30  # refuse archives that unpack to more than this
MAX_ZIP_MEMBERS = 100_000  # refuse archives with more entries than this
_SKIPPED = ("__MACOSX",)  # archive folders that are never scene data


class UploadError(ValueError):
    """An upload that is not a usable scene; the message says what is wrong and how to fix it."""


@dataclass(frozen=True)
class Scene:
    """A checked scene folder and what it holds."""

    root: Path  # the scene folder training reads (for a video: the folder its frames will go to)
    frames: dict[str, int]  # split -> number of frames (photos without poses: {"photos": n})
    width: int
    height: int
    poses_from: Path | None = None  # a photo folder or video whose poses structure from motion must find first

    def summary(self) -> str:
        if self.poses_from is not None and self.poses_from.is_file():
            return f"a video at {self.width}x{self.height}, poses by structure from motion"
        splits = ", ".join(f"{n} {split}" for split, n in self.frames.items())
        extra = ", poses by structure from motion" if self.poses_from is not None else ""
        return f"{splits} views at {self.width}x{self.height}{extra}"


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
    """The shallowest folder under ``folder`` that is a scene: posed (any layout lift3d reads) or photos alone."""
    from lift3d.data.colmap_model import find_model
    from lift3d.data.sfm import photo_folder

    def is_scene(path: Path) -> bool:
        return ((path / "transforms_train.json").is_file() or (path / "transforms.json").is_file()
                or find_model(path) is not None)

    candidates = [p for p in [folder, *folder.rglob("*")] if p.is_dir() and _SKIPPED[0] not in p.parts]
    candidates.sort(key=lambda p: (len(p.parts), str(p)))
    posed = [p for p in candidates if is_scene(p) and not any(is_scene(q) for q in p.parents if q in candidates)]
    if len(posed) > 1 and len(posed[1].parts) == len(posed[0].parts):
        raise UploadError(f"the upload holds several scenes ({posed[0].name}, {posed[1].name}); upload one")
    if posed:
        return posed[0]
    photos = [p for p in candidates if photo_folder(p) is not None]
    if photos:
        return photos[0].parent if photos[0].name == "images" else photos[0]
    others = sorted(p.name for p in folder.rglob("transforms_*.json"))
    raise UploadError(
        "the upload has no scene and no photos"
        + (f" (found {', '.join(others)}, but no transforms_train.json)" if others else "")
        + ". Upload photos (a .zip or the files; poses come from structure from motion), a video, or a posed scene: "
        "Blender (transforms_train.json + images), nerfstudio / instant-ngp (transforms.json + images) or COLMAP "
        "(sparse/0 + images/)."
    )


def _image_index(files: Sequence[Path]) -> dict[str, list[Path]]:
    index: dict[str, list[Path]] = {}
    for path in files:
        if path.suffix in IMAGE_SUFFIXES:
            index.setdefault(path.name, []).append(path)
            index.setdefault(path.stem, []).append(path)
    return index


def assemble_flat_files(files: Sequence[Path], dest: Path) -> Path:
    """Rebuild a scene folder from files uploaded without their sub-folders (a browser folder upload): a Blender
    scene by its frames' file names, or loose photos into ``images/``."""
    transforms = [f for f in files if f.name.startswith("transforms_") and f.suffix == ".json"]
    if not transforms:
        photos = [f for f in files if f.suffix in IMAGE_SUFFIXES]
        if not photos:
            raise UploadError("the uploaded files include no photos and no transforms_train.json; upload photos, a "
                              "video, the scene folder or a .zip of it")
        if len({f.name for f in photos}) < len(photos):
            raise UploadError("several uploaded photos share a name; upload a .zip of the folder instead")
        (dest / "images").mkdir(parents=True, exist_ok=True)
        for photo in photos:
            shutil.copyfile(photo, dest / "images" / photo.name)
        return dest
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
    """Read the scene's cameras (or list its photos); SceneFormatError says what is malformed."""
    from PIL import Image

    from lift3d.data.scene import read_capture, split_frames
    from lift3d.data.sfm import has_poses, photo_folder

    if not has_poses(root):
        folder = photo_folder(root)
        photos = sorted(p for p in folder.iterdir() if p.suffix in IMAGE_SUFFIXES)
        if len(photos) < 2:
            raise UploadError(f"the upload holds {len(photos)} photo(s): structure from motion needs many overlapping "
                              "photos of the object (20 or more, all around it)")
        with Image.open(photos[0]) as first:
            width, height = first.size
        return Scene(root, {"photos": len(photos)}, width, height, poses_from=root)
    capture, _ = read_capture(root)
    if capture.missing:  # an upload should be complete: say which files did not come
        shown = ", ".join(capture.missing[:5]) + (" ..." if len(capture.missing) > 5 else "")
        raise UploadError(f"{len(capture.missing)} of {len(capture.missing) + len(capture.frames)} frames listed in the "
                          f"upload have no image file: {shown}")
    splits = capture.splits or split_frames(capture, 8)  # the layout's own splits, else the holdout lift3d makes
    frames = {split: len(indices) for split, indices in splits.items() if indices}
    lens = capture.frames[0].lens
    return Scene(root, frames, lens.width, lens.height)


def check_video(path: Path) -> Scene:
    """An uploaded video: readable, with frames; its scene folder is where its frames will go."""
    import imageio.v2 as imageio

    from lift3d.data.video import frames_folder

    try:
        reader = imageio.get_reader(str(path), "ffmpeg")
        height, width = reader.get_next_data().shape[:2]
        reader.close()
    except Exception as error:
        raise UploadError(f"{path.name} is not a readable video ({error}); upload an .mp4 or .mov") from None
    return Scene(frames_folder(path), {}, width, height, poses_from=path)


def prepare_image(uploads: Sequence[str | Path], dest: str | Path) -> Path:
    """The one photo of an image-to-3D upload, checked (readable) and copied under ``dest``."""
    from lift3d.data.images import load_rgba

    files = [Path(u) for u in uploads or []]
    if len(files) != 1 or files[0].suffix not in IMAGE_SUFFIXES:
        raise UploadError("upload one photo of the object (.png or .jpg; a PNG with a transparent background works best)")
    try:
        load_rgba(files[0])
    except SceneFormatError as error:
        raise UploadError(str(error)) from None
    Path(dest).mkdir(parents=True, exist_ok=True)
    return Path(shutil.copyfile(files[0], Path(dest) / files[0].name))


def prepare_scene(uploads: Sequence[str | Path], dest: str | Path) -> Scene:
    """A checked scene under ``dest`` from uploaded files: one .zip, one video, or a folder's files."""
    files = [Path(u) for u in uploads or []]
    if not files:
        raise UploadError("upload photos: a .zip of them (or of a posed scene folder), the photos themselves, or a video")
    dest = Path(dest)
    zips = [f for f in files if f.suffix.lower() == ".zip"]
    videos = [f for f in files if f.suffix.lower() in VIDEO_SUFFIXES]
    if zips or videos:
        if len(files) > 1:
            raise UploadError("upload either one .zip, one video, or a folder's files, not several of them")
        if videos:
            dest.mkdir(parents=True, exist_ok=True)
            target = dest / videos[0].name
            shutil.copyfile(videos[0], target)
            return check_video(target)
        safe_extract_zip(zips[0], dest)
        root = find_scene_root(dest)
    else:
        root = assemble_flat_files(files, dest)
    try:
        return check_scene(root)
    except SceneFormatError as error:
        raise UploadError(str(error).replace(str(root), "the upload")) from None

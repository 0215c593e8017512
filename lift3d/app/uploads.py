"""Photo uploads for reconstruction, checked before a run: a .zip (unpacked safely), a folder's files, or a video.

A .zip may hold a posed scene in any capture format lift3d reads (``lift3d.data.formats``) or just photos;
photos without poses and videos get their cameras from structure from motion (``lift3d poses``) as the run's
first stage. Browsers upload a folder's files without their sub-folders, so a Blender folder upload is
rebuilt by matching each frame's file name, and loose photos are gathered into ``images/``.

Uploads come from whoever can reach the page, so nothing in one reaches outside it: archives are checked for
their unpacked size (a cap, a compression-ratio limit and the free disk) before a byte is written, every
frame path a scene names must lie inside the upload, and a rejected upload leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
import stat
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from lift3d.data import formats
from lift3d.data.capture import SceneFormatError
from lift3d.data.formats.video import FORMAT as VIDEO
from lift3d.data.transforms_json import IMAGE_SUFFIXES

MAX_UPLOAD_BYTES = 2 * 2**30  # default cap on one upload, unpacked (`lift3d app --max-upload-gb`)
MAX_ZIP_MEMBERS = 100_000  # refuse archives with more entries than this
MAX_ZIP_RATIO = 100  # refuse archives (or members) that inflate more than this many times: photos barely compress
RATIO_FLOOR_BYTES = 32 * 2**20  # ... once they unpack to more than this (small text files may compress more)
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


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_zip_size(archive: Path, members: Sequence[zipfile.ZipInfo], dest: Path, max_bytes: int) -> int:
    """The archive's unpacked total from its directory, refused (UploadError) when over ``max_bytes``, when it
    inflates more than MAX_ZIP_RATIO times (a zip bomb, not photos), or when the disk under ``dest`` lacks room."""
    total = sum(m.file_size for m in members)
    if total > max_bytes:
        raise UploadError(f"{archive.name} unpacks to {_gib(total)}, more than this app accepts ({_gib(max_bytes)}; "
                          "lift3d app --max-upload-gb sets it): upload fewer or smaller photos")
    packed = max(archive.stat().st_size, 1)
    bombs = [m for m in members if m.file_size > RATIO_FLOOR_BYTES and m.file_size > MAX_ZIP_RATIO * max(m.compress_size, 1)]
    if bombs or (total > RATIO_FLOOR_BYTES and total > MAX_ZIP_RATIO * packed):
        what = f"'{bombs[0].filename}' inflates to {_gib(bombs[0].file_size)}" if bombs else f"it inflates to {_gib(total)}"
        raise UploadError(f"{archive.name} is {_gib(packed)} but {what}, more than {MAX_ZIP_RATIO} times its packed size: "
                          "photos barely compress, so this is not a scene; zip the scene folder itself")
    folder = dest
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    free = shutil.disk_usage(folder).free
    if total > free:
        raise UploadError(f"{archive.name} unpacks to {_gib(total)} but the server has {_gib(free)} free; "
                          "upload a smaller scene or ask the operator to free disk space")
    return total


def safe_extract_zip(archive: str | Path, dest: str | Path, max_bytes: int = MAX_UPLOAD_BYTES) -> None:
    """Unpack ``archive`` into ``dest``, refusing path traversal, links and archive bombs before anything is written
    (the unpacked total is checked from the archive's directory; zipfile never inflates a member past its listed size)."""
    archive, dest = Path(archive), Path(dest)
    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as error:
        raise UploadError(f"{archive.name} is not a readable .zip archive ({error}); zip the scene folder again") from None
    with zf:
        members = zf.infolist()
        if len(members) > MAX_ZIP_MEMBERS:
            raise UploadError(f"{archive.name} has {len(members)} entries (at most {MAX_ZIP_MEMBERS})")
        plan = []
        for member in members:
            parts = _member_parts(member.filename, archive)
            if stat.S_ISLNK(member.external_attr >> 16):
                raise UploadError(f"{archive.name} holds a symbolic link '{member.filename}'; links are not unpacked")
            if parts and parts[0] not in _SKIPPED:
                plan.append((member, parts))
        budget = check_zip_size(archive, [m for m, _ in plan], dest, max_bytes)
        with _removed_on_failure(dest):
            dest.mkdir(parents=True, exist_ok=True)
            root = dest.resolve()
            for member, parts in plan:
                try:
                    budget = _unpack_member(zf, member, dest.joinpath(*parts), root, archive, budget)
                except (zipfile.BadZipFile, zlib.error, EOFError) as error:  # a bad checksum, a stream cut short
                    raise UploadError(f"{archive.name} is damaged: '{member.filename}' does not unpack ({error}); "
                                      "zip the scene folder again and upload it once more") from None
                except OSError as error:  # a name too long for the disk, a file where the archive has a folder
                    raise UploadError(f"{archive.name}: '{member.filename}' cannot be unpacked here "
                                      f"({_os_reason(error)}); {_os_fix(error)}") from None


def _unpack_member(zf: zipfile.ZipFile, member: zipfile.ZipInfo, target: Path, root: Path, archive: Path,
                   budget: int) -> int:
    """Unpack one member at ``target`` (inside ``root``), at most ``budget`` bytes; returns the budget left."""
    if not target.resolve().is_relative_to(root):  # belt and braces: nothing lands outside dest
        raise UploadError(f"{archive.name}: '{member.filename}' would unpack outside the upload folder")
    if member.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        return budget
    target.parent.mkdir(parents=True, exist_ok=True)
    with zf.open(member) as source, open(target, "wb") as out:
        while chunk := source.read(1 << 20):
            budget -= len(chunk)
            if budget < 0:  # more bytes than the directory declared: stop at once
                raise UploadError(f"{archive.name} unpacks to more than its directory says; zip the scene folder again")
            out.write(chunk)
    return budget


def _os_reason(error: OSError) -> str:
    return error.strerror or type(error).__name__


def _os_fix(error: OSError) -> str:
    """What to do about an OSError while unpacking or copying an upload."""
    if error.errno == errno.ENAMETOOLONG:
        return "shorten the file and folder names (at most 255 bytes each) and zip it again"
    if error.errno in (errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
        return "the archive holds a file and a folder of one name: rename one of them and zip it again"
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the server's disk is full: upload a smaller scene or ask the operator to free disk space"
    return "zip the scene folder again"


@contextlib.contextmanager
def _removed_on_failure(dest: Path) -> Iterator[None]:
    """On any error inside, remove what was written under ``dest`` (all of it when it did not exist before)."""
    before = set(dest.iterdir()) if dest.is_dir() else None
    try:
        yield
    except BaseException:
        if before is None:
            shutil.rmtree(dest, ignore_errors=True)
        elif dest.is_dir():
            for path in set(dest.iterdir()) - before:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
        raise


def find_scene_root(folder: Path) -> Path:
    """The shallowest folder under ``folder`` that is a scene: posed (any layout lift3d reads) or photos alone."""
    from lift3d.data.formats.photos import photo_folder

    def is_scene(path: Path) -> bool:
        return formats.detect(path, posed_only=True) is not None

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
        + ". Upload photos (a .zip or the files; poses come from structure from motion), a video, or a posed scene "
        f"with its images: {formats.posed_list()}."
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


def referenced_paths(root: Path) -> list[tuple[str, Path]]:
    """Every file the scene in ``root`` names, as (the path as written, where it points), read from the format's raw
    files (``CaptureFormat.named_files``: transforms JSON, the COLMAP model's image names) before any is opened."""
    from lift3d.data.scene import detect

    record = detect(root)
    return record.named_files(root) if record.named_files is not None else []


def _outside(path: Path, boundary: Path) -> bool:
    return not path.resolve().is_relative_to(boundary.resolve())


def check_inside(root: Path, boundary: Path) -> None:
    """Refuse a scene that names files outside ``boundary`` (the upload folder): absolute paths, ``../`` or
    links out. A job would otherwise train on, and show, whatever files of the server it names."""
    bad = [written for written, path in referenced_paths(root) if _outside(path, boundary)]
    if bad:
        shown = ", ".join(f"'{b}'" for b in dict.fromkeys(bad[:3])) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise UploadError(f"the upload names files outside itself: {shown}; frame paths must be relative to the scene "
                          "folder and stay inside the upload (no absolute paths, no '..')")


def check_scene(root: Path, boundary: Path | None = None) -> Scene:
    """Read the scene's cameras (or list its photos); SceneFormatError says what is malformed. Every file the
    scene names must lie inside ``boundary`` (the upload folder; default ``root``), checked before it is read."""
    from lift3d.data.formats.photos import photo_folder
    from lift3d.data.scene import read_capture, split_frames
    from lift3d.data.sfm import has_poses
    from lift3d.imaging import open_image

    if not has_poses(root):
        folder = photo_folder(root)
        photos = sorted(p for p in folder.iterdir() if p.suffix in IMAGE_SUFFIXES)
        if len(photos) < 2:
            raise UploadError(f"the upload holds {len(photos)} photo(s): structure from motion needs many overlapping "
                              "photos of the object (20 or more, all around it)")
        sizes = []
        for photo in photos:  # headers only: a bomb or a file that is no photo is named now, not in the job
            try:
                with open_image(photo, photo.name, UploadError) as image:
                    sizes.append(image.size)
            except (OSError, SyntaxError) as error:
                raise UploadError(f"{photo.name} is not a readable photo ({error}); upload .jpg or .png photos") from None
        width, height = sizes[0]
        return Scene(root, {"photos": len(photos)}, width, height, poses_from=root)
    boundary = boundary or root
    check_inside(root, boundary)
    capture, _ = read_capture(root)
    outside = [frame.name or str(p) for frame in capture.frames for p in (frame.image, frame.mask)
               if p is not None and _outside(p, boundary)]
    if outside:  # the reader's own view of its frames, checked as well (a layout the raw check does not know)
        raise UploadError(f"the upload names files outside itself: '{outside[0]}'; frame paths must stay inside the upload")
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

    from lift3d.data.video import check_video_size, ffmpeg_reason, frames_folder

    try:
        reader = imageio.get_reader(str(path), "ffmpeg")
        try:
            check_video_size(path, reader.get_meta_data())
            height, width = reader.get_next_data().shape[:2]
        finally:
            reader.close()
    except SceneFormatError as error:
        raise UploadError(str(error).replace(str(path), path.name)) from None
    except Exception as error:
        raise UploadError(f"{path.name} is not a readable video ({ffmpeg_reason(error)}); upload an .mp4 or .mov") from None
    return Scene(frames_folder(path), {}, width, height, poses_from=path)


def prepare_image(uploads: Sequence[str | Path], dest: str | Path, max_bytes: int = MAX_UPLOAD_BYTES) -> Path:
    """The one photo of an image-to-3D upload, checked (readable, at most ``max_bytes``) and copied under ``dest``."""
    from lift3d.data.images import load_rgba

    files = [Path(u) for u in uploads or []]
    if len(files) != 1 or files[0].suffix not in IMAGE_SUFFIXES:
        raise UploadError("upload one photo of the object (.png or .jpg; a PNG with a transparent background works best)")
    _check_sizes(files, max_bytes)
    try:
        load_rgba(files[0])
    except SceneFormatError as error:
        raise UploadError(str(error)) from None
    dest = Path(dest)
    with _removed_on_failure(dest):
        dest.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copyfile(files[0], dest / files[0].name))


def _check_sizes(files: Sequence[Path], max_bytes: int) -> None:
    total = sum(f.stat().st_size for f in files if f.is_file())
    if total > max_bytes:
        raise UploadError(f"the upload is {_gib(total)}, more than this app accepts ({_gib(max_bytes)}; lift3d app "
                          "--max-upload-gb sets it): upload fewer or smaller photos")


def prepare_scene(uploads: Sequence[str | Path], dest: str | Path, max_bytes: int = MAX_UPLOAD_BYTES) -> Scene:
    """A checked scene under ``dest`` from uploaded files: one .zip, one video, or a folder's files; at most
    ``max_bytes`` unpacked. A rejected upload leaves nothing under ``dest``."""
    files = [Path(u) for u in uploads or []]
    if not files:
        raise UploadError("upload photos: a .zip of them (or of a posed scene folder), the photos themselves, or a video")
    dest = Path(dest)
    zips = [f for f in files if f.suffix.lower() == ".zip"]
    videos = [f for f in files if VIDEO.detect(f)]
    if (zips or videos) and len(files) > 1:
        raise UploadError("upload either one .zip, one video, or a folder's files, not several of them")
    if not zips:
        _check_sizes(files, max_bytes)
    with _removed_on_failure(dest):
        if videos:
            dest.mkdir(parents=True, exist_ok=True)
            target = dest / videos[0].name
            shutil.copyfile(videos[0], target)
            return check_video(target)
        if zips:
            safe_extract_zip(zips[0], dest, max_bytes)
            root = find_scene_root(dest)
        else:
            root = assemble_flat_files(files, dest)
        try:
            return check_scene(root, dest)
        except SceneFormatError as error:
            raise UploadError(str(error).replace(str(root), "the upload")) from None

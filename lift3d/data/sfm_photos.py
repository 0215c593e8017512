"""What structure from motion needs to know of each photo before COLMAP sees it: its upright size, its camera
(EXIF make, model, focal length) and so which photos share one COLMAP camera.

Photos of one camera share intrinsics; COLMAP refines one set per camera. A camera here is one distinct
(upright size, EXIF make, model, focal length): a phone's portrait and landscape photos are two cameras with
the same focal length in pixels (their sizes are swapped), two phones are two cameras, and a video or a
folder of same-size photos without EXIF is one camera. COLMAP reads the stored pixels and ignores EXIF
orientation, while lift3d loads photos upright (``lift3d.data.images``): photos stored rotated are handed to
COLMAP as upright copies, so the poses and sizes it writes match the photos lift3d trains on.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from PIL import ImageOps

from lift3d.data.capture import SceneFormatError
from lift3d.imaging import open_image

DEFAULT_FOCAL_FACTOR = 1.2  # COLMAP's focal length without EXIF: 1.2 * max(width, height)
FULL_FRAME_DIAGONAL_MM = math.hypot(36.0, 24.0)  # 35 mm equivalents scale the image diagonal (as COLMAP reads them)
_MM_PER_UNIT = {2: 25.4, 3: 10.0, 4: 1.0, 5: 0.001}  # EXIF FocalPlaneResolutionUnit: inch, cm, mm, um
_EXIF_IFD = 0x8769
_MAKE, _MODEL, _ORIENTATION = 0x010F, 0x0110, 0x0112
_FOCAL, _FOCAL_35MM = 0x920A, 0xA405
_PLANE_X_RESOLUTION, _PLANE_UNIT, _PIXEL_X, _PIXEL_Y = 0xA20E, 0xA210, 0xA002, 0xA003
_ROTATED = range(2, 9)  # EXIF orientations other than "stored upright"


@dataclass(frozen=True)
class Photo:
    """One photo as COLMAP should see it: the upright size and what EXIF says of the camera."""

    name: str  # path inside the photo folder (as COLMAP names the image)
    width: int  # upright (EXIF orientation applied)
    height: int
    orientation: int  # EXIF orientation (1: stored upright)
    make: str  # EXIF camera make and model ("" when absent)
    model: str
    focal_mm: float  # EXIF focal length (0: absent)
    focal_35mm: float  # EXIF 35 mm equivalent focal length (0: absent)
    focal_px: float  # focal length in pixels from EXIF (0: EXIF does not say)

    @property
    def camera_key(self) -> tuple:
        """Photos with the same key share one COLMAP camera."""
        return (self.width, self.height, self.make, self.model, self.focal_mm, self.focal_35mm)


@dataclass
class CameraGroup:
    """The photos of one COLMAP camera, and the focal length it starts from."""

    photos: list[Photo]
    focal_px: float  # the prior: from EXIF, else DEFAULT_FOCAL_FACTOR * max(width, height)
    from_exif: bool  # whether focal_px came from EXIF (COLMAP then trusts it as a prior)
    camera_id: int = -1  # COLMAP's id once features are extracted

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.photos]

    def describe(self) -> str:
        """e.g. ``4032x3024 Apple iPhone 12, 26 mm equiv.`` or ``200x150, no EXIF``."""
        first = self.photos[0]
        label = " ".join(dict.fromkeys(s for s in (first.make, first.model) if s))  # the model often repeats the make
        lens = f"{first.focal_35mm:g} mm equiv." if first.focal_35mm else f"{first.focal_mm:g} mm" if first.focal_mm else ""
        details = ", ".join(s for s in (label, lens) if s) or "no EXIF"
        return f"{first.width}x{first.height} {details}" if label else f"{first.width}x{first.height}, {details}"


def _number(value) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError, ZeroDivisionError):
        return 0.0
    return number if math.isfinite(number) and number > 0 else 0.0


def _text(value) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value or "").replace("\x00", "").strip()


def read_photo(folder: Path, name: str) -> Photo:
    """The upright size and EXIF camera of the photo ``folder / name`` (the header only: no decoding)."""
    path = folder / name
    try:
        with open_image(path, str(path), SceneFormatError) as image:
            stored_w, stored_h = image.size
            exif = image.getexif()
            sub = exif.get_ifd(_EXIF_IFD)
    except (OSError, SyntaxError, ValueError) as error:
        raise SceneFormatError(f"cannot read the photo {path}: {error} (remove it or save it again as .jpg/.png)") from None
    orientation = int(_number(exif.get(_ORIENTATION, 1))) or 1
    width, height = (stored_h, stored_w) if orientation in (5, 6, 7, 8) else (stored_w, stored_h)
    focal_mm, focal_35mm = _number(sub.get(_FOCAL)), _number(sub.get(_FOCAL_35MM))
    focal_px = 0.0
    if focal_35mm:
        focal_px = focal_35mm / FULL_FRAME_DIAGONAL_MM * math.hypot(width, height)
    elif focal_mm and _number(sub.get(_PLANE_X_RESOLUTION)) and int(_number(sub.get(_PLANE_UNIT, 2))) in _MM_PER_UNIT:
        pixels_per_mm = _number(sub.get(_PLANE_X_RESOLUTION)) / _MM_PER_UNIT[int(_number(sub.get(_PLANE_UNIT, 2)))]
        original = max(_number(sub.get(_PIXEL_X)), _number(sub.get(_PIXEL_Y)))  # the sensor's size, before any resize
        focal_px = focal_mm * pixels_per_mm * (max(width, height) / original if original else 1.0)
    return Photo(name, width, height, orientation, _text(exif.get(_MAKE)), _text(exif.get(_MODEL)), focal_mm,
                 focal_35mm, focal_px)


def cut_short(path: Path) -> str | None:
    """Why the photo at ``path`` is incomplete (a file cut short: a copy or upload that stopped), or None when its
    image data is whole. A JPEG that ends with its end-of-image marker is whole; any other (one with a trailer, as
    motion photos have, or one cut short) is decoded at an eighth of its size, which reads every byte of its scan; a
    PNG's chunks are checked against their checksums."""
    try:
        if path.suffix.lower() in (".jpg", ".jpeg"):
            with open(path, "rb") as handle:
                handle.seek(max(0, path.stat().st_size - 64))
                if handle.read().rstrip(b"\0\r\n ").endswith(b"\xff\xd9"):
                    return None
        with open_image(path, str(path), SceneFormatError) as image:
            if image.format == "PNG":
                image.verify()
            else:
                image.draft("RGB", (max(1, image.width // 8), max(1, image.height // 8)))
                image.load()
    except (OSError, SyntaxError) as error:
        return str(error) or type(error).__name__
    return None


def _listed(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def usable_photos(images: Path, names: list[str]) -> list[str]:
    """The photos of ``names`` that structure from motion can use: photos cut short (truncated files) and exact
    copies of an earlier photo are left out, each kind with one named warning; a set that leaves fewer than two
    distinct photos is refused, saying which."""
    import hashlib
    import logging

    log = logging.getLogger("lift3d.sfm")
    broken = {name: reason for name in names if (reason := cut_short(images / name)) is not None}
    if broken:
        log.warning("%d of %d photos are cut short (truncated files) and are left out: %s; copy them again from the "
                    "camera", len(broken), len(names), _listed(list(broken)))
    first_of: dict[str, str] = {}
    copies: dict[str, str] = {}
    for name in names:
        if name not in broken:
            digest = hashlib.sha256((images / name).read_bytes()).hexdigest()
            if digest in first_of:
                copies[name] = first_of[digest]
            else:
                first_of[digest] = name
    kept = [name for name in names if name not in broken and name not in copies]
    if len(kept) < 2 and copies:
        raise SceneFormatError(f"the {len(names) - len(broken)} photos in {images} are identical (copies of "
                               f"{next(iter(first_of.values()))}): they show no parallax, and structure from motion "
                               "needs photos taken from different spots around the object (20 or more)")
    if len(kept) < 2:
        raise SceneFormatError(f"{images} holds {len(kept)} whole photo(s) ({len(broken)} cut short: "
                               f"{_listed(list(broken))}): structure from motion needs at least two overlapping photos")
    if copies:
        log.warning("%d photos are exact copies of others and are left out (a copy adds no parallax): %s", len(copies),
                    ", ".join(f"{copy} (= {original})" for copy, original in list(copies.items())[:4])
                    + (f" and {len(copies) - 4} more" if len(copies) > 4 else ""))
    return kept


def group_cameras(photos: list[Photo]) -> list[CameraGroup]:
    """One group per distinct camera key, in the order of their first photo."""
    groups: dict[tuple, list[Photo]] = {}
    for photo in photos:
        groups.setdefault(photo.camera_key, []).append(photo)
    result = []
    for members in groups.values():
        first = members[0]
        focal = first.focal_px or DEFAULT_FOCAL_FACTOR * max(first.width, first.height)
        result.append(CameraGroup(members, focal, bool(first.focal_px)))
    return result


def upright_folder(images: Path, photos: list[Photo], work: Path) -> Path:
    """The folder COLMAP reads: ``images`` itself when every photo is stored upright, else ``work`` holding
    upright copies of the rotated photos and links to the rest (same names, so the model names the originals)."""
    if all(p.orientation not in _ROTATED for p in photos):
        return images
    work.mkdir(parents=True, exist_ok=True)
    for photo in photos:
        target = work / photo.name
        target.parent.mkdir(parents=True, exist_ok=True)
        if photo.orientation not in _ROTATED:
            try:
                os.symlink(images.resolve() / photo.name, target)
            except OSError:  # no symlinks (some file systems, Windows without the privilege): copy
                shutil.copy2(images / photo.name, target)
            continue
        with open_image(images / photo.name, photo.name, SceneFormatError) as image:
            upright = ImageOps.exif_transpose(image)  # as lift3d.data.images loads it
        params = {"quality": 95} if target.suffix.lower() in (".jpg", ".jpeg") else {}
        upright.save(target, **params)
    return work

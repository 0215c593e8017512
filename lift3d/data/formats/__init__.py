"""The capture formats: one module per format in this folder, each registering one ``FORMAT`` record.

A new capture format is one new module here (and its test) whose ``FORMAT = register_format(CaptureFormat(...))``
enters it in the registry (``lift3d.registry``, kind ``capture-format``; a plugin package registers its own the
same way). ``formats()`` reads the registry in ``priority`` order, so detection, reading, ``data.format``'s choices
and the format lists in help and error texts (the data module, ``lift3d reconstruct``, the app's uploads) follow it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lift3d.data.capture import Capture, SceneFormatError
from lift3d.registry import CAPTURE_FORMAT, calling_module, entries, register_entry

# reads a capture: (root, downscale) -> (capture, the downscale left to apply when its images are read)
Reader = Callable[[Path, int], tuple[Capture, int]]


@dataclass(frozen=True)
class CaptureFormat:
    """One capture format: how to recognize it, how to read it, and what it is (for recipes and messages)."""

    name: str  # the name captures and records carry (``Capture.format`` may name the dialect read)
    description: str  # what the user gives, for help and error texts, e.g. "COLMAP (sparse/0/ beside images/)"
    detect: Callable[[Path], bool]  # whether a path holds this format (cheap: file names, no parsing)
    read: Reader | None = None  # None: the format has no poses (structure from motion gives them first)
    object_centric: bool = False  # renders of one object on a transparent background (no world around it)
    priority: int = 100  # detection order, lowest first (a folder matching several formats is the first's)
    config_names: tuple[str, ...] | None = None  # data.format values that pick it (None: its name; () none)
    # files the layout's own files name, as (written, path), read without opening them (for upload checks)
    named_files: Callable[[Path], list[tuple[str, Path]]] | None = None
    # the capture again for another downscale, without re-reading it (None: the downscale changes nothing)
    rescale: Callable[[Capture, int], tuple[Capture, int]] | None = None

    @property
    def posed(self) -> bool:
        return self.read is not None

    @property
    def names(self) -> tuple[str, ...]:
        """The ``data.format`` values that pick this format."""
        if not self.posed:
            return ()
        return (self.name,) if self.config_names is None else self.config_names


def register_format(record: CaptureFormat) -> CaptureFormat:
    """Enter ``record`` in the registry under its name, in detection order by its ``priority``; returns it."""
    return register_entry(CAPTURE_FORMAT, record.name, record, priority=record.priority, owner=calling_module())


def formats() -> tuple[CaptureFormat, ...]:
    """Every registered capture format (this package's and plugins'), in detection order (priority, then name)."""
    return tuple(sorted(entries(CAPTURE_FORMAT).values(), key=lambda f: (f.priority, f.name)))


def posed_formats() -> tuple[CaptureFormat, ...]:
    return tuple(f for f in formats() if f.posed)


def config_names() -> tuple[str, ...]:
    """``data.format``'s choices: ``auto`` and every posed format's names."""
    return ("auto", *(name for f in posed_formats() for name in f.names))


def by_config_name(name: str) -> CaptureFormat:
    for record in posed_formats():
        if name in record.names:
            return record
    raise SceneFormatError(f"data.format must be one of {', '.join(config_names())}, got {name!r}")


def by_name(name: str) -> CaptureFormat:
    """The format of ``name`` (a record's name or one of its data.format names)."""
    for record in formats():
        if name == record.name or name in record.names:
            return record
    raise KeyError(name)


def detect(path: Path, posed_only: bool = False) -> CaptureFormat | None:
    """The first format (in priority order) that ``path`` holds, or None."""
    for record in posed_formats() if posed_only else formats():
        if record.detect(path):
            return record
    return None


def is_object_centric(name: str) -> bool:
    """Whether captures of format ``name`` are renders of one object (unknown names: no)."""
    try:
        return by_name(name).object_centric
    except KeyError:
        return False


def is_photographed(name: str) -> bool:
    """Whether captures of format ``name`` are photos of a real scene: a known format that is not object-centric."""
    try:
        return not by_name(name).object_centric
    except KeyError:
        return False


def _or_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + ", or " + items[-1]


def posed_list() -> str:
    """The posed formats for a sentence: "Blender / ... (...), nerfstudio ... (...), or COLMAP (...)"."""
    return _or_list([f.description for f in posed_formats()])


def unposed_list() -> str:
    """The formats that need structure from motion for a sentence: "a folder of photos alone, or a video"."""
    return _or_list([f.description for f in formats() if not f.posed])

"""One registry for every kind of extension: name -> entry, per kind, with third-party plugins via entry points.

Kinds (``KINDS``): ``part`` (every configurable class a config names by ``*_type``: data modules, fields, renderers,
guidance, generators, systems, ...; registered with ``@register("name")``), ``capture-format`` (a
``lift3d.data.formats.CaptureFormat``), ``export-format`` (a ``lift3d.export.formats.ExportFormat``) and
``gaussian-codec`` (a ``lift3d.gaussians.formats.codec.GaussianCodec``, named by its file suffix). ``register(name,
kind=...)`` decorates a class; ``register_entry(kind, name, obj)`` registers any object. ``find(name, kind=...)`` and
``entries(kind)`` import the kind's built-in packages on first use, then the modules of the ``lift3d.modules``
entry-point group: a plugin package declares ``[project.entry-points."lift3d.modules"] my_plugin = "my_plugin.module"``
and that module, imported, registers whatever kinds it adds (an entry point naming a class registers it as a part).
Two owners of one name within a kind are an error naming both; a miss names the closest name of the kind.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import logging
import pkgutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "lift3d.modules"
PART, CAPTURE_FORMAT, EXPORT_FORMAT, GAUSSIAN_CODEC = "part", "capture-format", "export-format", "gaussian-codec"
DEFAULT_PRIORITY = 100


@dataclass(frozen=True)
class Kind:
    """A kind of extension: what it is called in messages and which packages hold its built-in entries."""

    label: str  # "capture format": for messages
    builtins: tuple[str, ...]  # packages imported on first use; "pkg.*" imports every module of pkg


KINDS: dict[str, Kind] = {
    PART: Kind("part", ("lift3d.data", "lift3d.fields", "lift3d.gaussians", "lift3d.meshes", "lift3d.render",
                        "lift3d.guidance", "lift3d.generators", "lift3d.systems", "lift3d.export")),
    CAPTURE_FORMAT: Kind("capture format", ("lift3d.data.formats.*",)),
    EXPORT_FORMAT: Kind("export format", ("lift3d.export.formats",)),
    GAUSSIAN_CODEC: Kind("Gaussian file codec", ("lift3d.gaussians.formats.*",)),
}


@dataclass(frozen=True)
class Entry:
    """One registered object and who registered it (for clash messages)."""

    name: str
    obj: Any
    owner: str  # "module.Class" for a class or function, else the module that registered it
    priority: int  # order in ``entries`` (lowest first); ties keep registration order
    order: int


_entries: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}
_loaded_builtins: set[str] = set()
_loaded_entry_points = False
_counter = 0

T = TypeVar("T")


class RegistryError(KeyError):
    """A name that no entry of a kind has (or that two owners claim)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def _kind(kind: str) -> Kind:
    if kind not in KINDS:
        raise RegistryError(f"unknown registry kind {kind!r}; kinds: {', '.join(KINDS)}")
    return KINDS[kind]


def _owner(obj: Any) -> str | None:
    qualname = getattr(obj, "__qualname__", None)
    return f"{obj.__module__}.{qualname}" if isinstance(qualname, str) else None


def calling_module(depth: int = 2) -> str:
    """The module ``depth`` calls above this one (2: the caller of the function asking): the owner a registration
    helper (``register_format``, ``register_codec``) passes on for the module that called it."""
    return sys._getframe(depth).f_globals.get("__name__", "?")


def register_entry(kind: str, name: str, obj: T, *, priority: int | None = None, owner: str | None = None) -> T:
    """Register ``obj`` as ``name`` of ``kind``; returns ``obj``. ``priority`` orders ``entries`` (lowest first; by
    default the object's own int ``priority`` attribute, else 100). The same owner registering again (a module imported
    twice) replaces its entry; another owner is a RegistryError naming both."""
    global _counter
    label = _kind(kind).label
    if priority is None:
        own = getattr(obj, "priority", None) if not isinstance(obj, type) else None
        priority = own if isinstance(own, int) and not isinstance(own, bool) else DEFAULT_PRIORITY
    owner = owner or _owner(obj) or calling_module()
    existing = _entries[kind].get(name)
    if existing is not None and existing.obj is not obj and existing.owner != owner:
        raise RegistryError(f"{label} '{name}' is registered twice: by {existing.owner} and by {owner}; rename one of them")
    _counter += 1
    _entries[kind][name] = Entry(name, obj, owner, priority, existing.order if existing is not None else _counter)
    return obj


def register(name: str, kind: str = PART) -> Callable[[T], T]:
    """Class decorator: make the class findable as ``name`` of ``kind`` (a part: from configs' ``*_type`` keys)."""
    _kind(kind)

    def decorator(cls: T) -> T:
        register_entry(kind, name, cls)
        if isinstance(cls, type):
            cls.registered_name = name
        return cls

    return decorator


def _import_builtins(kind: str) -> None:
    if kind in _loaded_builtins:
        return
    _loaded_builtins.add(kind)
    for package in KINDS[kind].builtins:
        if package.endswith(".*"):
            module = importlib.import_module(package[:-2])
            for info in pkgutil.iter_modules(module.__path__):
                importlib.import_module(f"{module.__name__}.{info.name}")
        else:
            importlib.import_module(package)


def _load_entry_points() -> None:
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            target: Any = entry_point.load()
        except RegistryError:  # a plugin claiming a name that is taken: an error, not a warning
            raise
        except Exception as error:  # a broken plugin must not hide the built-in entries
            log.warning("lift3d plugin %r (%s) failed to load: %s", entry_point.name, entry_point.value, error)
            continue
        if isinstance(target, type) and entry_point.name not in _entries[PART]:
            register(entry_point.name)(target)


def _load(kind: str) -> None:
    _import_builtins(kind)
    _load_entry_points()


def entries(kind: str) -> dict[str, Any]:
    """Every entry of ``kind`` (built-ins and plugins loaded), name -> object, by priority then registration order."""
    _kind(kind)
    _load(kind)
    ordered = sorted(_entries[kind].values(), key=lambda entry: (entry.priority, entry.order))
    return {entry.name: entry.obj for entry in ordered}


def owners(kind: str) -> dict[str, str]:
    """name -> who registered it, for every entry of ``kind`` (built-ins and plugins loaded)."""
    _kind(kind)
    _load(kind)
    return {name: entry.owner for name, entry in _entries[kind].items()}


def closest(name: str, names: list[str]) -> str | None:
    """The name of ``names`` closest to ``name`` (a typo's fix), or None."""
    close = difflib.get_close_matches(name, names, n=1)
    return close[0] if close else None


def miss_message(name: str, kind: str = PART) -> str:
    """The one-line message for a ``name`` that no entry of ``kind`` has: the closest name, then every name."""
    names = sorted(_entries[kind])
    near = closest(name, names)
    hint = f" Did you mean '{near}'?" if near else ""
    return (f"no {_kind(kind).label} is registered as '{name}'.{hint} Registered: {', '.join(names) or 'none'}. "
            f"Plugins register through the '{ENTRY_POINT_GROUP}' entry-point group.")


def find(name: str, kind: str = PART) -> Any:
    """The entry registered as ``name`` of ``kind``; a miss (RegistryError) names the closest name and lists them all."""
    _kind(kind)
    registered = _entries[kind]
    if name not in registered:
        _import_builtins(kind)
    if name not in registered:
        _load_entry_points()
    if name in registered:
        return registered[name].obj
    raise RegistryError(miss_message(name, kind))


def registered_names(kind: str = PART) -> list[str]:
    """Every name of ``kind``, built-ins and plugins loaded, sorted."""
    return sorted(entries(kind))

"""Name -> class registry for every configurable part, with third-party plugins via entry points.

Built-in parts register on import of their package; ``find`` imports those packages on a miss, then
the ``lift3d.modules`` entry-point group, so ``find("my-geometry")`` works for a plugin package that
declares ``[project.entry-points."lift3d.modules"] my_plugin = "my_plugin.module"`` (the target is
imported; it registers its classes with ``@register``) or points straight at a class.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import logging
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "lift3d.modules"
_BUILTIN_PACKAGES = (
    "lift3d.data",
    "lift3d.fields",
    "lift3d.gaussians",
    "lift3d.meshes",
    "lift3d.render",
    "lift3d.guidance",
    "lift3d.generators",
    "lift3d.systems",
    "lift3d.export",
)

_registry: dict[str, type] = {}
_loaded_builtins = False
_loaded_entry_points = False

T = TypeVar("T", bound=type)


class RegistryError(KeyError):
    """A name that no registered part has (or that two parts claim)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def register(name: str) -> Callable[[T], T]:
    """Class decorator: make the class findable as ``name`` from configs."""

    def decorator(cls: T) -> T:
        existing = _registry.get(name)
        if existing is not None and existing is not cls:
            same = f"{existing.__module__}.{existing.__qualname__}" == f"{cls.__module__}.{cls.__qualname__}"
            if not same:  # a module imported twice under one name re-registers itself: harmless
                raise RegistryError(
                    f"'{name}' is registered twice: by {existing.__module__}.{existing.__qualname__} "
                    f"and by {cls.__module__}.{cls.__qualname__}; rename one of them"
                )
        _registry[name] = cls
        cls.registered_name = name
        return cls

    return decorator


def _load_builtins() -> None:
    global _loaded_builtins
    if _loaded_builtins:
        return
    _loaded_builtins = True
    for package in _BUILTIN_PACKAGES:
        importlib.import_module(package)


def _load_entry_points() -> None:
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            target: Any = entry_point.load()
        except Exception as error:  # a broken plugin must not hide the built-in parts
            log.warning("lift3d plugin %r (%s) failed to load: %s", entry_point.name, entry_point.value, error)
            continue
        if isinstance(target, type) and entry_point.name not in _registry:
            register(entry_point.name)(target)


def find(name: str) -> type:
    """The class registered as ``name``; a miss lists the registered names and the closest one."""
    if name not in _registry:
        _load_builtins()
    if name not in _registry:
        _load_entry_points()
    if name in _registry:
        return _registry[name]
    names = sorted(_registry)
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" Did you mean '{close[0]}'?" if close else ""
    raise RegistryError(
        f"no part is registered as '{name}'.{hint} Registered: {', '.join(names)}. "
        f"Plugins register through the '{ENTRY_POINT_GROUP}' entry-point group."
    )


def registered_names() -> list[str]:
    """Every registered name, built-ins and plugins loaded."""
    _load_builtins()
    _load_entry_points()
    return sorted(_registry)

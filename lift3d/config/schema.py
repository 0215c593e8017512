"""Validation of configs against dataclass schemas, with errors that name the key, where it was written and a fix.

Every configurable part declares a ``Config`` dataclass. A field ``foo: dict`` next to a field
``foo_type: str`` holds the config of the part registered as ``foo_type`` and is validated against
that part's ``Config``, so one walk checks a whole experiment, however deeply its parts nest.
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lift3d.config.declarations import check_message, declaration_of, declared_bounds
from lift3d.schedule import validate_schedule

T = TypeVar("T")


class ConfigError(ValueError):
    """A config that does not match its schema; the message names the key, its source and a fix."""


def scheduled(default: Any, *, low: float | None = None, above: float | None = None, high: float | None = None,
              below: float | None = None, allowed: Sequence[Any] = (), example: Any = None, **kwargs: Any) -> Any:
    """A dataclass field that accepts a number or a schedule (see ``lift3d.schedule``); ``low`` / ``above`` / ``high``
    / ``below`` / ``allowed`` bound every value of it, as ``bounded`` does a plain number."""
    if example is None and isinstance(default, (int, float)) and not isinstance(default, bool):
        example = default
    bounds = declared_bounds(low=low, above=above, high=high, below=below, allowed=tuple(allowed), example=example)
    metadata = {"scheduled": True, **({"declared": bounds} if bounds else {}), **kwargs.pop("metadata", {})}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata, **kwargs)
    return field(default=default, metadata=metadata, **kwargs)


@dataclass
class Sources:
    """Where each config layer came from, to say where an offending key was written."""

    layers: list[tuple[str, DictConfig]] = field(default_factory=list)
    prefix: str = ""  # the path of the layers' root in the full keys asked about (a part's config: its path)

    def where(self, full_key: str) -> str:
        """The label of the last layer that sets ``full_key``."""
        index = self.last_layer(full_key)
        return "the defaults" if index < 0 else self.layers[index][0]

    def last_layer(self, full_key: str) -> int:
        """The index of the last layer that sets ``full_key`` (-1: none)."""
        missing = object()
        if self.prefix:
            full_key = full_key[len(self.prefix) + 1:] if full_key.startswith(self.prefix + ".") else ""
        for index in range(len(self.layers) - 1, -1, -1):
            if OmegaConf.select(self.layers[index][1], full_key, default=missing, throw_on_missing=False) is not missing:
                return index
        return -1


def join_key(path: str, key: str) -> str:
    """``path.key`` (``key`` at the root)."""
    return f"{path}.{key}" if path else key


def _is_dataclass_type(annotation: Any) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def _field_types(schema: type) -> dict[str, Any]:
    import typing

    hints = typing.get_type_hints(schema)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(schema)}


def _unknown_key_error(key: str, valid: Sequence[str], path: str, sources: Sources, owner: str) -> ConfigError:
    full = join_key(path, key)
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    hint = f" Did you mean '{join_key(path, close[0])}'?" if close else ""
    return ConfigError(
        f"unknown config key '{full}' (in {sources.where(full)}) for {owner}.{hint} "
        f"Valid keys here: {', '.join(sorted(valid)) or '(none)'}."
    )


def check_config(schema: type, node: Any, path: str = "", sources: Sources | None = None) -> None:
    """Check ``node`` against dataclass ``schema``: unknown keys, types, schedules, typed sub-parts."""
    sources = sources or Sources()
    owner = schema.__qualname__
    if node is None:
        return
    if not isinstance(node, (dict, DictConfig)):
        raise ConfigError(f"'{path or '<root>'}' (in {sources.where(path)}) must be a mapping for {owner}, got {node!r}")
    types = _field_types(schema)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    migrate_renamed_keys(schema, node, path, sources)
    for key in node:
        if key not in fields:
            raise _unknown_key_error(str(key), list(fields), path, sources, owner)
    for name, f in fields.items():
        if name not in node:
            continue
        full = join_key(path, name)
        value = node[name]
        if f.metadata.get("scheduled"):
            try:
                validate_schedule(OmegaConf.to_container(value) if isinstance(value, ListConfig) else value)
            except ValueError as error:
                raise ConfigError(f"'{full}' (in {sources.where(full)}): {error}") from None
        elif _is_dataclass_type(types[name]):
            check_config(types[name], value, full, sources)
        elif name.endswith("_type") is False and f"{name}_type" in fields:
            type_name = node.get(f"{name}_type", fields[f"{name}_type"].default)
            if type_name:
                check_config(_part_config(str(type_name), join_key(path, f"{name}_type"), sources), value, full, sources)
    # types of plain fields (OmegaConf knows how to check and convert them)
    try:
        typed = OmegaConf.merge(OmegaConf.structured(schema), _shallow(node, types))
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", "") or ""
        full = join_key(path, key) if key else path
        reason = str(error).splitlines()[0]
        raise ConfigError(f"'{full}' (in {sources.where(full)}) is invalid for {owner}: {reason}") from None
    # declared choices and bounds, on the values as the typed config holds them
    for name, f in fields.items():
        declaration = declaration_of(schema, name)
        if declaration is None or name not in node or _is_dataclass_type(types[name]):
            continue
        full = join_key(path, name)
        try:
            value = typed[name]
            if isinstance(value, (DictConfig, ListConfig)):
                value = OmegaConf.to_container(value, resolve=True)
        except OmegaConfBaseException:  # an interpolation that cannot resolve outside the whole experiment
            continue
        message = check_message(full, declaration, value, sources.where(full), bool(f.metadata.get("scheduled")))
        if message:
            raise ConfigError(message)


def check_instance(instance: Any, path: str, where: str) -> None:
    """The declared choices and bounds of a config dataclass instance and the instances nested in it (a config built
    in code rather than loaded; ``where`` says where it came from)."""
    for f in dataclasses.fields(instance):
        value = getattr(instance, f.name)
        full = join_key(path, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_instance(value, full, where)
            continue
        declaration = declaration_of(type(instance), f.name)
        message = declaration and check_message(full, declaration, value, where, bool(f.metadata.get("scheduled")))
        if message:
            raise ConfigError(message)


def migrate_renamed_keys(schema: type, node: Any, path: str = "", sources: Sources | None = None) -> None:
    """Move values written under a key the schema renamed (its ``RENAMED``: old name -> new name) to the new key, with
    a warning naming both; old names keep loading for one release. Where both are set, the later layer wins (a user's
    old-name override over a recipe's new name); both in one layer is an error. A name may be a dotted path below the
    schema's node: a key moved across levels (e.g. ``densify.resolution_schedule`` -> ``resolution_schedule``)."""
    sources = sources or Sources()
    for old, new in getattr(schema, "RENAMED", {}).items():
        if not _has_key(node, old):
            continue
        full_old, full_new = join_key(path, old), join_key(path, new)
        has_new = _has_key(node, new)
        if has_new and sources.last_layer(full_old) == sources.last_layer(full_new):
            raise ConfigError(f"'{full_old}' (in {sources.where(full_old)}) is the old name of '{full_new}', and both are "
                              f"set: keep only {full_new}")
        old_wins = not has_new or sources.last_layer(full_old) > sources.last_layer(full_new)
        warnings.warn(f"config key '{full_old}' (in {sources.where(full_old)}) is now '{full_new}': the old name works "
                      "until the next release", FutureWarning, stacklevel=2)
        old_parent, old_key = _parent(node, old)
        if old_wins:
            new_parent, new_key = _parent(node, new, create=True)
            with _writable(new_parent):
                new_parent[new_key] = old_parent[old_key]
        with _writable(old_parent):
            del old_parent[old_key]


def _parent(node: Any, dotted: str, create: bool = False) -> tuple[Any, str]:
    """(the mapping that holds the last part of ``dotted``, that part); ``create``: make missing mappings on the way."""
    *parents, leaf = dotted.split(".")
    for key in parents:
        if key not in node and create:
            with _writable(node):
                node[key] = {}
        node = node[key]
    return node, leaf


def _has_key(node: Any, dotted: str) -> bool:
    """Whether ``dotted`` (``a.b.c``) names a key set below the mapping ``node``."""
    *parents, leaf = dotted.split(".")
    for key in parents:
        if not isinstance(node, (dict, DictConfig)) or key not in node:
            return False
        node = node[key]
    return isinstance(node, (dict, DictConfig)) and leaf in node


class _writable:
    """Lifts OmegaConf's struct / read-only flags on a node while keys are moved."""

    def __init__(self, node: Any) -> None:
        self.node = node

    def __enter__(self) -> None:
        if isinstance(self.node, DictConfig):
            self.flags = (self.node._get_node_flag("struct"), self.node._get_node_flag("readonly"))
            OmegaConf.set_struct(self.node, False)
            OmegaConf.set_readonly(self.node, False)

    def __exit__(self, *exc: Any) -> None:
        if isinstance(self.node, DictConfig):
            OmegaConf.set_struct(self.node, self.flags[0])
            OmegaConf.set_readonly(self.node, self.flags[1])


def _shallow(node: Any, types: dict[str, Any]) -> dict:
    """The node without nested dataclass values (already checked) so OmegaConf checks plain fields."""
    container = OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else dict(node)
    return {k: v for k, v in container.items() if not _is_dataclass_type(types.get(k))}


def _part_config(type_name: str, path: str, sources: Sources) -> type:
    from lift3d.registry import RegistryError, find

    try:
        cls = find(type_name)
    except RegistryError as error:
        raise ConfigError(f"'{path}' (in {sources.where(path)}): {error}") from None
    schema = getattr(cls, "Config", None)
    if schema is None or not dataclasses.is_dataclass(schema):
        raise ConfigError(f"'{type_name}' ({cls.__qualname__}) has no Config dataclass")
    return schema


def parse_structured(schema: type[T], cfg: Any = None, path: str = "") -> T:
    """Validate ``cfg`` (dict, DictConfig, instance or None) against ``schema``; return an instance. ``path`` names
    the config in errors (keys read ``path.key``)."""
    label = f"the config of {path or schema.__qualname__}"
    if isinstance(cfg, schema):
        check_instance(cfg, path, label)
        return cfg
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        cfg = dataclasses.asdict(cfg)
    node = OmegaConf.create(cfg or {})
    check_config(schema, node, path, Sources([(label, node)], prefix=path))
    merged = OmegaConf.merge(OmegaConf.structured(schema), node)
    return OmegaConf.to_object(merged)  # type: ignore[return-value]

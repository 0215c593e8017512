"""Config layers: YAML files (with their ``base:`` chains), dotlist overrides, their merge, and the plugins they
import (refused for configs inside run folders unless trusted, since those may be someone else's)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import omegaconf
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lift3d.config.schema import ConfigError, join_key
from lift3d.limits import CONFIG_BYTES

COMMAND_LINE = "the command-line overrides"  # the label of the overrides' layer in error messages


def register_resolvers() -> None:
    for name, fn in {
        "add": lambda a, b: a + b,
        "sub": lambda a, b: a - b,
        "mul": lambda a, b: a * b,
        "div": lambda a, b: a / b,
    }.items():
        if not OmegaConf.has_resolver(name):
            # resolvers that get their arguments resolved: omegaconf 2.3 calls them register_new_resolver (its
            # register_resolver is the legacy kind, handed the raw '${trainer.max_steps}'); 2.4 renamed them back
            # to register_resolver and deprecated register_new_resolver
            modern = tuple(int(v) for v in omegaconf.__version__.split(".")[:2]) >= (2, 4)
            (OmegaConf.register_resolver if modern else OmegaConf.register_new_resolver)(name, fn)


def load_yaml_layers(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[str, DictConfig]]:
    """Layers of one YAML file: its ``base:`` chain first (relative paths), then the file itself."""
    path = path.expanduser()
    if not path.is_file():
        if re.fullmatch(r"[A-Za-z_][\w.]*", str(path)) and path.suffix not in (".yaml", ".yml"):
            raise ConfigError(f"'{path}' is neither a config file nor an override: overrides are key=value, "
                              f"e.g. {path}=...")
        raise ConfigError(f"config file not found: {path} (give a path to a YAML file, e.g. configs/<recipe>.yaml)")
    if path.resolve() in seen:
        raise ConfigError(f"config 'base:' chain loops back to {path}")
    node = read_yaml(path)
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path} must hold a mapping at the top level")
    layers: list[tuple[str, DictConfig]] = []
    bases = node.pop("base", None)
    for base in [bases] if isinstance(bases, str) else list(bases or []):
        layers += load_yaml_layers((path.parent / str(base)), seen + (path.resolve(),))
    imports = node.get("imports")
    if imports:  # plugin .py paths are relative to the file that lists them
        node["imports"] = [
            str((path.parent / entry).resolve()) if str(entry).endswith(".py") and not Path(str(entry)).is_absolute() else entry
            for entry in imports
        ]
    layers.append((str(path), node))
    return layers


def read_yaml(path: Path, error: type[Exception] = ConfigError) -> Any:
    """A YAML file through OmegaConf (YAML's safe loader: plain data only, aliases expanded within OmegaConf's
    limit), its size checked against ``CONFIG_BYTES`` first; any failure is ``error`` with one line that names the
    file and the problem: a Python tag the safe loader refuses, an alias bomb, or a syntax error."""
    CONFIG_BYTES.check(str(path), path.stat().st_size, error, "a config holds a few kilobytes of settings: give the "
                       "right file")
    try:
        check_alias_expansion(path.read_text(encoding="utf-8", errors="replace"))
        return OmegaConf.load(path)
    except Exception as problem:
        raise error(yaml_problem(path, problem)) from None


MAX_EXPANDED_NODES = 1_000_000  # a config's YAML nodes once its aliases are expanded (a real one has a few hundred)


class AliasExpansionError(ValueError):
    """A YAML document whose aliases expand past ``MAX_EXPANDED_NODES``."""


def check_alias_expansion(text: str, limit: int = MAX_EXPANDED_NODES) -> None:
    """Refuse a YAML alias bomb before anything expands it, whatever OmegaConf's version: the document is composed
    (aliases stay shared nodes) and its expanded size counted once per node."""
    import yaml

    sizes: dict[int, int] = {}

    def size(node: Any) -> int:
        if id(node) not in sizes:
            sizes[id(node)] = 0  # a node inside itself (a recursive alias) counts once
            children = node.value if isinstance(node.value, list) else []
            items = [part for child in children for part in (child if isinstance(child, tuple) else (child,))]
            sizes[id(node)] = min(limit + 1, 1 + sum(size(item) for item in items))
        return sizes[id(node)]

    for document in yaml.compose_all(text, Loader=yaml.SafeLoader):
        if document is not None and size(document) > limit:
            raise AliasExpansionError(f"alias expansion exceeds {limit} nodes")


def yaml_problem(path: Path, problem: BaseException) -> str:
    """One line for a YAML file that did not load: what the safe loader refused, or the parser's own words."""
    text = " ".join(str(problem).split())
    where = getattr(problem, "problem_mark", None)
    at = f" (line {where.line + 1})" if where is not None else ""
    tag = re.search(r"constructor for the tag '(?:tag:yaml\.org,2002:)?([^']+)'", text)
    if tag:
        return (f"{path} uses the YAML tag !!{tag.group(1)}{at}, which lift3d's safe YAML loader refuses: configs hold "
                "plain data (mappings, lists, text, numbers), never Python objects; remove the tag")
    if "expansion exceeds" in text:
        return (f"{path} expands its YAML aliases (*name) past the limit{at}: a YAML bomb, or a config that repeats one "
                "anchor far too often; write the values out, or repeat fewer")
    return f"could not parse {path} as YAML: {text}"


def _plugin_module_name(entry: str) -> str:
    """The name a plugin is imported under: ``lift3d_plugin_<stem>`` for a ``.py`` path, else the dotted name."""
    return f"lift3d_plugin_{Path(entry).stem}" if entry.endswith(".py") else entry


def import_plugins(modules: Sequence[str]) -> None:
    """Import plugin modules by dotted name or by ``.py`` path so their parts register."""
    for entry in modules:
        entry = str(entry)
        if entry.endswith(".py"):
            file = Path(entry)
            if not file.is_file():
                raise ConfigError(f"plugin file listed in 'imports' not found: {entry}")
            module_name = _plugin_module_name(entry)
            if module_name in sys.modules:
                continue
            spec = importlib.util.spec_from_file_location(module_name, file)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
        else:
            try:
                importlib.import_module(entry)
            except ImportError as error:
                raise ConfigError(f"could not import plugin module '{entry}' listed in 'imports': {error}") from None


ALLOW_IMPORTS_FLAG = "--allow-imports"  # the CLI flag that lets configs inside run folders import their plugins
_RUN_IMPORTS_ALLOWED = False  # set for a whole command by --allow-imports (a chained stage reads its previous run's config)


def run_imports_allowed() -> bool:
    """Whether ``allow_run_imports()`` (``--allow-imports``) let run folders' configs import their plugins."""
    return _RUN_IMPORTS_ALLOWED


def allow_run_imports(allowed: bool = True) -> None:
    """Let (or stop letting) configs inside run folders import their plugins for the rest of this process: what
    ``--allow-imports`` sets, so that configs read deep inside a run (a previous stage's) follow it too."""
    global _RUN_IMPORTS_ALLOWED
    _RUN_IMPORTS_ALLOWED = allowed


def in_run_folder(path: str | Path) -> bool:
    """Whether a config file lies inside a run folder (a folder holding ``configs/parsed.yaml``: the file in its
    ``configs/`` or elsewhere up to three levels below it): written by a run, possibly someone else's, so its
    ``imports`` are not run without ``--allow-imports``. Judged on the path as given and as resolved, so no symlink
    hides where a config comes from (``RUN/configs/parsed.yaml`` linked to ``../settings.yaml``, ``RUN/configs``
    linked to a folder of another name, a link to a run's config from outside it)."""
    given = Path(os.path.abspath(Path(path).expanduser()))
    for candidate in dict.fromkeys((given, given.resolve())):
        for folder in list(candidate.parents)[:3]:
            if os.path.lexists(folder / "configs" / "parsed.yaml"):
                return True
    return False


def refuse_imports(entries: Sequence[Any], source: str) -> None:
    """ConfigError when importing ``entries`` (listed by ``source``, a config not trusted to run code) would execute
    anything: plugins already imported in this process run nothing again and pass."""
    pending = [str(e) for e in entries if _plugin_module_name(str(e)) not in sys.modules]
    if pending:
        raise ConfigError(
            f"{source} lists imports: {', '.join(pending)}. A config inside a run folder may come from someone else, and "
            f"importing would run that Python code, so lift3d does not; pass {ALLOW_IMPORTS_FLAG} if you trust this run "
            "folder and its code"
        )


def _part_type_changes(new: Any, old: Any, path: str, found: list[str]) -> None:
    """Paths of part configs ``<x>`` whose ``<x>_type`` the layer ``new`` changes from its value in ``old``
    (inside the system or data config only: a recipe that switches ``system_type`` over a base recipe
    usually picks a subclass that shares the base's options)."""
    if not isinstance(new, dict) or not isinstance(old, dict):
        return
    for key, value in new.items():
        key = str(key)
        if key.endswith("_type") and isinstance(value, str) and path:
            part, before = key[: -len("_type")], old.get(key)
            if isinstance(before, str) and before != value and isinstance(old.get(part), dict) and old[part]:
                found.append(join_key(path, part))
        elif isinstance(value, dict):
            _part_type_changes(value, old.get(key), join_key(path, key), found)


def merge_layers(layers: Sequence[DictConfig]) -> DictConfig:
    """Merge config layers in order (later wins). A layer that switches a part of the system or data
    config to another type (``<x>_type``) drops the options earlier layers gave the old part under ``<x>``:
    they belong to a part that is no longer used (so ``system.guidance_type=analytic`` works over a
    Stable Diffusion recipe). Top-level ``system_type`` / ``data_type`` switches keep their options."""
    merged = OmegaConf.create()
    for layer in layers:
        resets: list[str] = []
        before = OmegaConf.to_container(merged, resolve=False)
        _part_type_changes(OmegaConf.to_container(layer, resolve=False), before, "", resets)
        for path in resets:
            OmegaConf.update(merged, path, None, merge=False)
        merged = OmegaConf.merge(merged, layer)
        for path in resets:
            if OmegaConf.select(merged, path, throw_on_resolution_failure=False) is None:
                OmegaConf.update(merged, path, {}, merge=False)
    return merged


def split_key(key: str) -> list[str]:
    """The path of a dotlist key: parts split at dots, ``\\.`` keeping a dot inside a part
    (``system.optimizer.params.field\\.encoding.lr`` -> [..., "params", "field.encoding", "lr"])."""
    return [part.replace("\\.", ".") for part in re.split(r"(?<!\\)\.", key)]


def dotlist_layer(overrides: Sequence[str]) -> DictConfig:
    """A config layer from ``key=value`` overrides. Values are read by OmegaConf's own dotlist parser; the keys
    are split here, so an escaped dot means the same on every supported omegaconf (2.3 splits at it)."""
    tree: dict[str, Any] = {}
    for item in overrides:
        key, value = item.split("=", 1)
        parts = split_key(key.strip())
        if not all(parts):
            raise ConfigError(f"override '{item}' has an empty key part (keys look like system.optimizer.args.lr)")
        try:
            parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"value={value}"]), resolve=False)["value"]
        except OmegaConfBaseException as error:
            raise ConfigError(f"could not read the value of override '{item}': {str(error).splitlines()[0]}") from None
        node = tree
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = parsed
    try:
        return OmegaConf.create(tree)
    except OmegaConfBaseException as error:
        raise ConfigError(f"could not parse the overrides {list(overrides)}: {error}") from None

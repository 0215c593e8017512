"""Structured configs: YAML files + dotlist overrides, validated against dataclasses with clear errors.

Every configurable part declares a ``Config`` dataclass. A field ``foo: dict`` next to a field
``foo_type: str`` holds the config of the part registered as ``foo_type`` and is validated against
that part's ``Config``, so one walk checks a whole experiment, however deeply its parts nest.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import omegaconf
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lift3d.schedule import validate_schedule

T = TypeVar("T")

COMMAND_LINE = "the command-line overrides"


class ConfigError(ValueError):
    """A config that does not match its schema; the message names the key, its source and a fix."""


def scheduled(default: Any, **kwargs: Any) -> Any:
    """A dataclass field that accepts a number or a schedule (see ``lift3d.schedule``)."""
    metadata = {"scheduled": True, **kwargs.pop("metadata", {})}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=metadata, **kwargs)
    return field(default=default, metadata=metadata, **kwargs)


# ---------------------------------------------------------------------------------------------------
# validation


@dataclass
class _Sources:
    """Where each config layer came from, to say where an offending key was written."""

    layers: list[tuple[str, DictConfig]] = field(default_factory=list)

    def where(self, full_key: str) -> str:
        missing = object()
        for label, layer in reversed(self.layers):
            if OmegaConf.select(layer, full_key, default=missing, throw_on_missing=False) is not missing:
                return label
        return "the defaults"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _is_dataclass_type(annotation: Any) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def _field_types(schema: type) -> dict[str, Any]:
    import typing

    hints = typing.get_type_hints(schema)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(schema)}


def _unknown_key_error(key: str, valid: Sequence[str], path: str, sources: _Sources, owner: str) -> ConfigError:
    full = _join(path, key)
    close = difflib.get_close_matches(key, list(valid), n=1, cutoff=0.5)
    hint = f" Did you mean '{_join(path, close[0])}'?" if close else ""
    return ConfigError(
        f"unknown config key '{full}' (in {sources.where(full)}) for {owner}.{hint} "
        f"Valid keys here: {', '.join(sorted(valid)) or '(none)'}."
    )


def check_config(schema: type, node: Any, path: str = "", sources: _Sources | None = None) -> None:
    """Check ``node`` against dataclass ``schema``: unknown keys, types, schedules, typed sub-parts."""
    sources = sources or _Sources()
    owner = schema.__qualname__
    if node is None:
        return
    if not isinstance(node, (dict, DictConfig)):
        raise ConfigError(f"'{path or '<root>'}' (in {sources.where(path)}) must be a mapping for {owner}, got {node!r}")
    types = _field_types(schema)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in node:
        if key not in fields:
            raise _unknown_key_error(str(key), list(fields), path, sources, owner)
    for name, f in fields.items():
        if name not in node:
            continue
        full = _join(path, name)
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
                check_config(_part_config(str(type_name), _join(path, f"{name}_type"), sources), value, full, sources)
    # types of plain fields (OmegaConf knows how to check and convert them)
    try:
        OmegaConf.merge(OmegaConf.structured(schema), _shallow(node, types))
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", "") or ""
        full = _join(path, key) if key else path
        reason = str(error).splitlines()[0]
        raise ConfigError(f"'{full}' (in {sources.where(full)}) is invalid for {owner}: {reason}") from None


def _shallow(node: Any, types: dict[str, Any]) -> dict:
    """The node without nested dataclass values (already checked) so OmegaConf checks plain fields."""
    container = OmegaConf.to_container(node, resolve=False) if isinstance(node, DictConfig) else dict(node)
    return {k: v for k, v in container.items() if not _is_dataclass_type(types.get(k))}


def _part_config(type_name: str, path: str, sources: _Sources) -> type:
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
    """Validate ``cfg`` (dict, DictConfig, instance or None) against ``schema``; return an instance."""
    if isinstance(cfg, schema):
        return cfg
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        cfg = dataclasses.asdict(cfg)
    node = OmegaConf.create(cfg or {})
    check_config(schema, node, path)
    merged = OmegaConf.merge(OmegaConf.structured(schema), node)
    return OmegaConf.to_object(merged)  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------------
# the experiment config


@dataclass
class TrainerConfig:
    """Options handed to ``lightning.Trainer``."""

    max_steps: int = 1000  # optimisation steps in the run
    val_check_interval: int = 500  # run validation every N training steps (0: never during training)
    log_every_n_steps: int = 10  # how often logged scalars are written
    precision: str = "32-true"  # Lightning precision: 32-true, 16-mixed, bf16-mixed
    accelerator: str = "auto"  # auto, cpu, gpu
    devices: Any = 1  # number of devices or a list of GPU ids (the CLI's --gpus sets this)
    strategy: str = "auto"  # Lightning strategy; multi-GPU runs use ddp
    sigterm_check_every: int = 100  # DDP: ranks agree on a received SIGTERM every N steps (Lightning: every step, a host sync each; 0: never)
    num_sanity_val_steps: int = 0  # validation batches run before training starts
    limit_val_batches: int | float = 1.0  # fraction or number of validation views per check
    gradient_clip_val: float | None = None  # clip gradient norm (None: off)
    enable_progress_bar: bool = True  # rich progress bar with loss, rate and ETA
    deterministic: bool = False  # ask torch for deterministic kernels (slower)
    run_test_after_fit: bool = True  # render the test views (orbit video) when training ends


@dataclass
class CheckpointConfig:
    """When checkpoints are written into the trial's ``ckpts/``."""

    every_n_train_steps: int = 1000  # periodic checkpoint interval in steps (0: only last.ckpt)
    save_last: bool = True  # keep ckpts/last.ckpt up to date at every checkpoint
    keep_periodic: int = -1  # how many periodic checkpoints to keep (-1: all)
    every_n_minutes: float = 0.0  # also refresh last.ckpt after this many minutes of training (0: off); needs save_last


@dataclass
class ViewerConfig:
    """The live viewer of a training run (``--viewer``; ``lift3d.viewer``): a viser page on ``host:port``."""

    enabled: bool = False  # serve the viewer while training (off: no server, no callback, no cost)
    host: str = "127.0.0.1"  # interface to listen on (0.0.0.0: the LAN)
    port: int = 8080  # port of the viewer page
    max_share: float = 0.1  # most of the training wall time the viewer's renders may take (0.1: 10%)
    preview_max_side: int = 256  # render size (longest side, pixels) while the camera moves
    max_side: int = 1024  # render size once the camera stops
    refresh_seconds: float = 2.0  # re-render a still view this often as the model trains (0: only when it moves)


@dataclass
class ExperimentConfig:
    """One run: which data, which system, how to train, where outputs go."""

    name: str = "default"  # experiment name: outputs/<name>/...
    tag: str = ""  # trial tag: outputs/<name>/<tag>@<timestamp>/ ("run" when empty)
    seed: int = 0  # base seed; each rank uses seed + rank
    output_root: str = "outputs"  # where trials are written
    use_timestamp: bool = True  # append @YYYYmmdd-HHMMSS to the trial folder
    resume: str | None = None  # checkpoint to resume from or to evaluate
    imports: list = field(default_factory=list)  # plugin modules (dotted names or .py paths) to import first
    data_type: str = ""  # registered data module name
    data: dict = field(default_factory=dict)  # the data module's config
    system_type: str = ""  # registered system name
    system: dict = field(default_factory=dict)  # the system's config
    trainer: TrainerConfig = field(default_factory=TrainerConfig)  # Lightning trainer options
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)  # checkpoint options
    viewer: ViewerConfig = field(default_factory=ViewerConfig)  # the live viewer while training (--viewer)


# ---------------------------------------------------------------------------------------------------
# loading


def _register_resolvers() -> None:
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


def _load_yaml_layers(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[str, DictConfig]]:
    """Layers of one YAML file: its ``base:`` chain first (relative paths), then the file itself."""
    path = path.expanduser()
    if not path.is_file():
        if re.fullmatch(r"[A-Za-z_][\w.]*", str(path)) and path.suffix not in (".yaml", ".yml"):
            raise ConfigError(f"'{path}' is neither a config file nor an override: overrides are key=value, "
                              f"e.g. {path}=...")
        raise ConfigError(f"config file not found: {path} (give a path to a YAML file, e.g. configs/<recipe>.yaml)")
    if path.resolve() in seen:
        raise ConfigError(f"config 'base:' chain loops back to {path}")
    try:
        node = OmegaConf.load(path)
    except Exception as error:
        raise ConfigError(f"could not parse {path} as YAML: {error}") from None
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path} must hold a mapping at the top level")
    layers: list[tuple[str, DictConfig]] = []
    bases = node.pop("base", None)
    for base in [bases] if isinstance(bases, str) else list(bases or []):
        layers += _load_yaml_layers((path.parent / str(base)), seen + (path.resolve(),))
    imports = node.get("imports")
    if imports:  # plugin .py paths are relative to the file that lists them
        node["imports"] = [
            str((path.parent / entry).resolve()) if str(entry).endswith(".py") and not Path(str(entry)).is_absolute() else entry
            for entry in imports
        ]
    layers.append((str(path), node))
    return layers


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


def allow_run_imports(allowed: bool = True) -> None:
    """Let (or stop letting) configs inside run folders import their plugins for the rest of this process: what
    ``--allow-imports`` sets, so that configs read deep inside a run (a previous stage's) follow it too."""
    global _RUN_IMPORTS_ALLOWED
    _RUN_IMPORTS_ALLOWED = allowed


def in_run_folder(path: str | Path) -> bool:
    """Whether a config file lies inside a run folder (``RUN/configs/*.yaml`` beside ``RUN/configs/parsed.yaml``):
    written by a run, possibly someone else's, so its ``imports`` are not run without ``--allow-imports``."""
    resolved = Path(path).expanduser().resolve()
    return resolved.parent.name == "configs" and (resolved.parent / "parsed.yaml").is_file()


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
                found.append(_join(path, part))
        elif isinstance(value, dict):
            _part_type_changes(value, old.get(key), _join(path, key), found)


def merge_layers(layers: Sequence[DictConfig]) -> DictConfig:
    """Merge config layers in order (later wins). A layer that switches a part of the system or data
    config to another type (``<x>_type``) drops the options earlier layers gave the old part under ``<x>``:
    they belong to a part that is no longer used (so ``system.guidance_type=analytic`` works over a
    Stable Diffusion recipe). Top-level ``system_type`` / ``data_type`` switches keep their options."""
    merged = OmegaConf.create()
    for layer in layers:
        resets: list[str] = []
        _part_type_changes(OmegaConf.to_container(layer, resolve=False), OmegaConf.to_container(merged, resolve=False), "", resets)
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


def load_config(*yaml_paths: str | Path, overrides: Sequence[str] = (), allow_imports: bool | None = None) -> ExperimentConfig:
    """Merge YAML files (later wins) and dotlist overrides, resolve interpolations, validate.

    ``allow_imports``: True imports every plugin listed in ``imports``; None (the default) refuses those listed by a
    config inside a run folder (``RUN/configs/*.yaml``, and the ``base:`` files it pulls in), which may be someone
    else's, unless ``allow_run_imports()`` was called; False refuses those of every file (overrides excepted).
    Refusal is a ConfigError naming the imports and ``--allow-imports``."""
    if allow_imports is None and _RUN_IMPORTS_ALLOWED:
        allow_imports = True
    _register_resolvers()
    sources = _Sources()
    untrusted: list[str] = []  # the files not trusted to run code that list imports
    for path in yaml_paths:
        layers = _load_yaml_layers(Path(path))
        if allow_imports is False or (allow_imports is None and in_run_folder(path)):
            untrusted += [label if label == str(path) else f"{label} (the base of {path})"
                          for label, node in layers if node.get("imports")]
        sources.layers += layers
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value (e.g. system.optimizer.args.lr=0.01)")
    sources.layers.append((COMMAND_LINE, dotlist_layer(overrides)))
    merged = merge_layers([layer for _, layer in sources.layers])
    try:
        OmegaConf.resolve(merged)
    except OmegaConfBaseException as error:
        raise ConfigError(f"could not resolve an interpolation: {str(error).splitlines()[0]}") from None
    imports = [str(entry) for entry in merged.get("imports", []) or []]
    if untrusted:  # what the merged config would import (interpolations resolved), once an untrusted file lists any
        refuse_imports(imports, untrusted[-1])
    import_plugins(imports)
    check_config(ExperimentConfig, merged, "", sources)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ExperimentConfig), merged))  # type: ignore[return-value]


def to_yaml(cfg: Any) -> str:
    """YAML text of a config dataclass or mapping (for configs/parsed.yaml)."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        cfg = OmegaConf.structured(cfg)
    return OmegaConf.to_yaml(OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg)

"""The recipes the web app offers: a friendly name, the config it runs, whether it takes a prompt or photos,
and which config keys the page's few options set.

A recipe is offered only when its config file exists and loads; each option (and the prompt or scene input)
is sent only to the keys that the recipe's config accepts, found by loading the config with that key set
(``probe_recipe``), so a table entry can never send a key its recipe does not know. More recipes (a
test-only one, a site's own) come from YAML files named by ``$LIFT3D_APP_RECIPES`` or ``--recipes``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lift3d.method_table import IMAGE, PHOTOS, Method, find_method, methods, needs_text, runs_on, stage_recipes

log = logging.getLogger("lift3d")

PROMPT = "prompt"  # input kind: a text prompt (text-to-3D)
RECIPES_ENV = "LIFT3D_APP_RECIPES"  # os.pathsep-separated YAML files with more app recipes

# the page's options: name -> (type, a value of that type used to probe whether a key is accepted)
OPTIONS: dict[str, tuple[type, Any]] = {
    "steps": (int, 1),
    "seed": (int, 0),
    "resolution": (int, 64),
    "guidance_scale": (float, 7.5),
    "model_path": (str, "probe/model"),
}

_GUIDED = {
    "steps": ("trainer.max_steps",),
    "seed": ("seed",),
    "resolution": ("data.height", "data.width"),
    "guidance_scale": ("system.guidance.guidance_scale",),
    "model_path": ("system.guidance.pretrained_model_name_or_path",),
}
_PROMPT_KEYS = ("system.guidance.prompt",)  # the text-to-3D recipes read the prompt from their guidance config
_RECONSTRUCT = {"steps": ("trainer.max_steps",), "seed": ("seed",)}
_IMAGE = {key: _GUIDED[key] for key in ("steps", "seed", "guidance_scale", "model_path")}


class RecipeError(ValueError):
    """An unknown recipe, a bad option value or a malformed recipes file; the message says the fix."""


@dataclass(frozen=True)
class AppRecipe:
    """One entry of the app's recipe menu."""

    label: str  # friendly name shown in the menu
    configs: tuple[str, ...]  # recipe names under lift3d/configs or YAML paths; the first that exists is used
    input: str = PROMPT  # prompt (text-to-3D), photos (reconstruction) or image (one photo: image-to-3D)
    input_keys: tuple[str, ...] = _PROMPT_KEYS  # config keys that receive the prompt, or the scene folder
    options: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # page option -> config keys it sets
    overrides: tuple[str, ...] = ()  # fixed overrides sent with every run of this recipe
    export: bool = True  # run `lift3d export` on the last checkpoint after training
    export_formats: tuple[str, ...] | None = None  # formats for `lift3d export --format` (None: the recipe's own)
    description: str = ""  # one line shown under the menu
    method: str = ""  # a method of the method table: the job runs it through lift3d reconstruct / generate (all stages)

    def __post_init__(self) -> None:
        if self.input not in (PROMPT, PHOTOS, IMAGE):
            raise RecipeError(f"app recipe '{self.label}': input must be '{PROMPT}', '{PHOTOS}' or '{IMAGE}', got '{self.input}'")
        unknown = sorted(set(self.options) - set(OPTIONS))
        if unknown:
            raise RecipeError(f"app recipe '{self.label}': unknown option(s) {unknown}; options are {sorted(OPTIONS)}")


def method_recipe(method: Method, on_cpu: bool = False) -> AppRecipe:
    """The app's entry for a method of the method table: the recipe its first stage trains on this machine (for the
    options and their defaults), its input, and the page options that fit its task; the job runs the method through
    ``lift3d reconstruct`` / ``lift3d generate``, every stage of it."""
    first = stage_recipes(method, on_cpu=on_cpu)[0]
    model = {"model_path": (method.weights_key,)} if method.weights_key else {}
    if method.task == PHOTOS:
        return AppRecipe(method.label, (first,), input=PHOTOS, input_keys=("data.root",), options=_RECONSTRUCT,
                         description=method.description, method=method.name)
    if method.task == IMAGE:
        options = {key: _GUIDED[key] for key in ("steps", "seed", "guidance_scale") if method.needs_cuda} | model
        if not method.needs_cuda:
            options = {"seed": ("seed",), **model}
        return AppRecipe(method.label, (first,), input=IMAGE, input_keys=("data.image",), options=options,
                         description=method.description, method=method.name)
    return AppRecipe(method.label, (first,), options={**{k: v for k, v in _GUIDED.items() if k != "model_path"}, **model},
                     description=method.description, method=method.name)


def default_recipes(on_cpu: bool = False) -> tuple[AppRecipe, ...]:
    """One entry per method of the method table (``lift3d.method_table``), in its order."""
    return tuple(method_recipe(method, on_cpu) for method in methods())


# --------------------------------------------------------------------------------------------- recipe files
_FILE_FIELDS = {f.name for f in dataclasses.fields(AppRecipe)} | {"config"}


def _as_tuple(value: Any) -> tuple[str, ...]:
    return (str(value),) if isinstance(value, (str, Path)) else tuple(str(v) for v in value)


def recipe_from_dict(entry: Mapping[str, Any], base_dir: Path | None = None) -> AppRecipe:
    """An ``AppRecipe`` from a mapping (a recipes-file entry); relative YAML paths are taken from ``base_dir``."""
    unknown = sorted(set(entry) - _FILE_FIELDS)
    if unknown:
        raise RecipeError(f"app recipe entry {dict(entry)!r}: unknown field(s) {unknown}; fields are {sorted(_FILE_FIELDS)}")
    if "label" not in entry or not ("config" in entry or "configs" in entry):
        raise RecipeError(f"app recipe entry {dict(entry)!r} needs 'label' and 'config' (a recipe name or a YAML path)")
    configs = _as_tuple(entry.get("configs", entry.get("config")))
    if base_dir is not None:
        configs = tuple(str(base_dir / c) if c.endswith((".yaml", ".yml")) and not Path(c).is_absolute() else c for c in configs)
    kwargs = {k: v for k, v in entry.items() if k not in ("config", "configs")}
    if "input_keys" in kwargs:
        kwargs["input_keys"] = _as_tuple(kwargs["input_keys"])
    kwargs["options"] = {str(k): _as_tuple(v) for k, v in dict(kwargs.get("options") or {}).items()}
    kwargs["overrides"] = _as_tuple(kwargs.get("overrides") or ())
    if kwargs.get("export_formats") is not None:
        kwargs["export_formats"] = _as_tuple(kwargs["export_formats"])
    return AppRecipe(configs=configs, **kwargs)


def load_recipe_file(path: str | Path) -> list[AppRecipe]:
    """Recipes from a YAML file holding a list of entries (the fields of ``AppRecipe``; ``config`` for one file)."""
    from omegaconf import OmegaConf

    from lift3d.config.layers import read_yaml

    path = Path(path).expanduser()
    if not path.is_file():
        raise RecipeError(f"app recipes file not found: {path}")
    entries = OmegaConf.to_container(read_yaml(path, RecipeError))
    if not isinstance(entries, list):
        raise RecipeError(f"{path} must hold a list of recipe entries (label, config, input, options, ...)")
    return [recipe_from_dict(entry, path.parent) for entry in entries]


def recipe_table(extra: Iterable[AppRecipe] = (), files: Sequence[str | Path] = (), on_cpu: bool = False) -> list[AppRecipe]:
    """The method table's entries (``on_cpu``: with the CPU variants a machine without CUDA runs), then recipes from
    ``files`` and ``$LIFT3D_APP_RECIPES``, then ``extra``; a later entry with the same label replaces an earlier one."""
    env_files = [p for p in os.environ.get(RECIPES_ENV, "").split(os.pathsep) if p.strip()]
    table: dict[str, AppRecipe] = {r.label: r for r in default_recipes(on_cpu)}
    for file in [*files, *env_files]:
        table.update((r.label, r) for r in load_recipe_file(file))
    table.update((r.label, r) for r in extra)
    return list(table.values())


# --------------------------------------------------------------------------------------------- probing
@dataclass(frozen=True)
class OfferedRecipe:
    """A recipe whose config exists, with the keys its config accepts for the input and each option."""

    recipe: AppRecipe
    config_path: Path  # the YAML that `lift3d train` runs
    name: str  # the config's experiment name: outputs/<name>/...
    input_keys: tuple[str, ...]  # keys receiving the prompt or the scene folder
    option_keys: Mapping[str, tuple[str, ...]]  # supported option -> accepted keys
    defaults: Mapping[str, Any] = field(default_factory=dict)  # option -> the value the config gives it, where it says

    @property
    def label(self) -> str:
        return self.recipe.label

    @property
    def input(self) -> str:
        return self.recipe.input

    @property
    def method(self) -> Method | None:
        """The method-table entry the recipe runs (None for a recipe file of the operator's)."""
        return find_method(self.recipe.method) if self.recipe.method else None

    @property
    def takes_prompt(self) -> bool:
        """An image recipe that also takes a text prompt (a prompt recipe always does)."""
        return self.input == PROMPT or (self.method is not None and self.method.prompt != "none")

    @property
    def needs_prompt(self) -> bool:
        return self.input == PROMPT or (self.method is not None and self.method.prompt == "required")

    def runs_on(self, cuda: bool) -> bool:
        """Whether the recipe does its job on a machine with (or without) a CUDA GPU."""
        return self.method is None or runs_on(self.method, cuda)

    def needs(self) -> str:
        """What the recipe needs, in a few words ("" for a recipe file of the operator's)."""
        return needs_text(self.method) if self.method is not None else ""


def _config_path(recipe: AppRecipe) -> Path | None:
    from lift3d.recipes import CONFIG_DIR

    for config in recipe.configs:
        path = Path(config).expanduser() if config.endswith((".yaml", ".yml")) else CONFIG_DIR / f"{config}.yaml"
        if path.is_file():
            return path.resolve()
    return None


def _accepts(path: Path, base: list[str], overrides: list[str]) -> bool:
    from lift3d.config import ConfigError, load_config

    try:
        load_config(path, overrides=base + overrides)
        return True
    except ConfigError:
        return False


def probe_recipe(recipe: AppRecipe) -> OfferedRecipe | None:
    """The recipe with the keys its config accepts, or None (logged) when its config is absent or broken."""
    from lift3d.config import ConfigError, load_config
    from lift3d.registry import RegistryError

    path = _config_path(recipe)
    if path is None:
        log.debug("app recipe '%s' is not offered: none of %s exists", recipe.label, list(recipe.configs))
        return None
    base = list(recipe.overrides)
    try:
        cfg = load_config(path, overrides=base)
    except (ConfigError, RegistryError, ImportError) as error:
        log.warning("app recipe '%s' is not offered: %s does not load: %s", recipe.label, path, error)
        return None
    probe_text = quote("probe")
    probes = {key: f"{key}={probe_text}" for key in recipe.input_keys}
    probes.update({key: f"{key}={format_value(OPTIONS[option][1])}" for option, keys in recipe.options.items() for key in keys})
    everything = _accepts(path, base, list(probes.values()))  # one load when the table is right; else key by key

    def accepted(key: str) -> bool:
        return everything or _accepts(path, base, [probes[key]])

    input_keys = tuple(k for k in recipe.input_keys if accepted(k))
    if not input_keys:
        log.warning("app recipe '%s' is not offered: its config %s accepts none of the input keys %s",
                    recipe.label, path, list(recipe.input_keys))
        return None
    option_keys: dict[str, tuple[str, ...]] = {}
    for option, keys in recipe.options.items():
        good = tuple(k for k in keys if accepted(k))
        if good:
            option_keys[option] = good
        else:
            log.warning("app recipe '%s': option '%s' is left out (its config accepts none of %s)", recipe.label, option,
                        list(keys))
    from omegaconf import OmegaConf

    full = OmegaConf.structured(cfg)
    defaults = {option: OmegaConf.select(full, keys[0], default=None) for option, keys in option_keys.items()}
    return OfferedRecipe(recipe, path, cfg.name, input_keys, option_keys, {k: v for k, v in defaults.items() if v is not None})


def offered_recipes(table: Iterable[AppRecipe]) -> list[OfferedRecipe]:
    """The recipes of ``table`` whose config exists and loads, in table order."""
    return [offered for offered in map(probe_recipe, table) if offered is not None]


def find_recipe(offered: Sequence[OfferedRecipe], label: str | None) -> OfferedRecipe:
    """The offered recipe named ``label``; an unknown name lists the offered ones."""
    for recipe in offered:
        if recipe.label == label:
            return recipe
    names = ", ".join(f"'{r.label}'" for r in offered) or "(none: no recipe config is installed)"
    raise RecipeError(f"unknown recipe '{label}'. Choose one of: {names}")


# --------------------------------------------------------------------------------------------- overrides
def quote(text: str) -> str:
    """``text`` as a single-quoted YAML scalar, so a dotlist override keeps it verbatim (no ``:``, ``#``,
    ``[`` or ``${`` surprises); newlines and runs of spaces become single spaces."""
    flat = " ".join(str(text).split()).replace("${", "\\${")
    return "'" + flat.replace("'", "''") + "'"


def format_value(value: Any) -> str:
    """A Python value as the right-hand side of a dotlist override."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return quote(str(value))


def check_option(option: str, value: Any) -> Any:
    """The option's value converted and checked; None for an empty field (the recipe's default is kept)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    kind = OPTIONS[option][0]
    if kind is str:
        return str(value).strip()
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise RecipeError(f"{option.replace('_', ' ')} must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise RecipeError(f"{option.replace('_', ' ')} must be finite, got {value!r}")
    if kind is int:
        if number != int(number):
            raise RecipeError(f"{option} must be a whole number, got {value!r}")
        number = int(number)
    limits = {"steps": (1, 10_000_000), "seed": (0, 2**31 - 1), "resolution": (8, 4096), "guidance_scale": (0.0, 1000.0)}
    low, high = limits[option]
    if not low <= number <= high:
        raise RecipeError(f"{option.replace('_', ' ')} must be between {low} and {high}, got {value!r}")
    return number


def build_overrides(offered: OfferedRecipe, input_value: str | None, options: Mapping[str, Any]) -> list[str]:
    """Dotlist overrides for one run: fixed ones, the input, then each option the user set and the recipe
    supports (options the recipe lacks are not sent)."""
    overrides = list(offered.recipe.overrides)
    if input_value is not None:  # a method's job gets its input on the command line instead
        overrides += [f"{key}={quote(input_value)}" for key in offered.input_keys]
    for option, value in options.items():
        if option not in OPTIONS:
            raise RecipeError(f"unknown option '{option}'; options are {sorted(OPTIONS)}")
        checked = check_option(option, value)
        if checked is None or option not in offered.option_keys:
            continue
        overrides += [f"{key}={format_value(checked)}" for key in offered.option_keys[option]]
    return overrides

"""Argument helpers shared by sub-commands."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_config_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("config", nargs="+" if required else "*", metavar="RECIPE_OR_CONFIG",
                        help="a recipe name (lift3d train --list), YAML config file(s) or, to evaluate or export, a run "
                             "folder; then dotlist overrides such as system.optimizer.args.lr=0.01")
    parser.add_argument("--resume", metavar="CKPT",
                        help="checkpoint to resume from (train) or to load (validate, test, export; default: the run "
                             "folder's ckpts/last.ckpt)")
    add_device_arguments(parser)
    add_allow_imports_argument(parser)


GPUS_HELP = ("comma-separated GPU ids, e.g. 0,1, or all: several GPUs train the same result sooner (every step count "
             "divided by the GPUs; trainer.rescale_steps=never keeps them)")
NODES_HELP = ("machines the run spans (each one starts the same command; under torchrun its --nnodes decides): "
              "docs/reconstruct.md, several GPUs")


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """``--gpus IDS|all`` and ``--nodes N``: where a training run's processes go."""
    parser.add_argument("--gpus", metavar="IDS", default=None, help=GPUS_HELP)
    parser.add_argument("--nodes", metavar="N", type=int, default=None, help=NODES_HELP)


def add_allow_imports_argument(parser: argparse.ArgumentParser) -> None:
    """``--allow-imports``: let configs inside run folders import the Python plugins they list (off: refused)."""
    parser.add_argument("--allow-imports", action="store_true",
                        help="let a run folder's configs import the plugin code they list ('imports:'); without it such a "
                             "config is refused, since a run folder may come from someone else")


def split_configs(items: list[str]) -> tuple[list[str], list[str]]:
    """Positional items -> (YAML paths, key=value overrides)."""
    paths = [item for item in items if "=" not in item]
    overrides = [item for item in items if "=" in item]
    return paths, overrides


def parse_gpus(text: str | None) -> Any:
    """``"0,1"`` -> [0, 1], ``"all"`` -> every GPU torch sees; None keeps the config's devices. A malformed value is the
    user's, a ConfigError."""
    from lift3d.config import ConfigError

    if text is None:
        return None
    if text.strip().lower() == "all":
        from lift3d.api.overrides import all_gpus

        return all_gpus()
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"--gpus takes comma-separated GPU ids such as 0,1; got '{text}'") from None
    if not ids:
        raise ConfigError("--gpus got no GPU ids")
    return ids


def resolve_recipe(item: str) -> str:
    """A positional config item as a file: a path that exists as given, else the shipped recipe of that name
    (``lift3d train gaussian-sds-analytic`` from any folder). An unknown name is a ConfigError naming the closest
    recipes; a dotted word without ``=`` is left to the config loader (it says overrides are key=value)."""
    import difflib
    import re

    from lift3d.config import ConfigError
    from lift3d.recipes import recipe_config, recipe_names

    path = Path(item).expanduser()
    if path.exists():
        return item
    names = recipe_names()
    if item in names:
        return str(recipe_config(item))
    if path.suffix in (".yaml", ".yml"):
        if path.stem in names:
            raise ConfigError(f"config file not found: {item}; {path.stem} is a recipe that ships with lift3d: give its "
                              f"name instead (lift3d train {path.stem}), which works from any folder")
        return item  # the loader says it is not found
    if re.fullmatch(r"[A-Za-z_][\w]*(\.[\w]+)+", item) or "/" in item or "\\" in item:
        return item  # a key without its =value, or a path: the loader's messages fit
    close = difflib.get_close_matches(item, names, n=3, cutoff=0.5)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    raise ConfigError(f"no config file or recipe named '{item}'{hint}: give a YAML file or a recipe name "
                      "(lift3d train --list shows them)")


def resolve_run_folder(path: str, args: argparse.Namespace) -> str:
    """A run folder given where a config goes: its ``configs/parsed.yaml``, and (evaluating or exporting, when no
    --resume is given) its ``ckpts/last.ckpt``. ``lift3d train RUN/`` is ambiguous (a new run or more steps of this
    one?), so it is refused with both commands. The config's ``imports`` are refused by ``load_config`` (it lies in a
    run folder) unless --allow-imports is given."""
    from pathlib import Path

    from lift3d.config import ConfigError

    folder = Path(path).expanduser()
    if not folder.is_dir():
        return path
    parsed, last = folder / "configs" / "parsed.yaml", folder / "ckpts" / "last.ckpt"
    if not parsed.is_file():
        raise ConfigError(f"{folder} is a folder, not a config: give a YAML file (a run folder holds configs/parsed.yaml)")
    if getattr(args, "command", "") == "train":
        raise ConfigError(f"{folder} is a run folder: continue it with lift3d train {parsed} --resume {last}, or start "
                          f"a new run from its settings with lift3d train {parsed}")
    if not getattr(args, "resume", None):
        if not last.is_file():
            raise ConfigError(f"{folder} has no checkpoint to load ({last} is missing): pass --resume CKPT")
        args.resume = str(last)
    return str(parsed)


def load_experiment(args: argparse.Namespace, extra_overrides: list[str] | None = None) -> tuple[Any, list[str], list[str]]:
    """The experiment config from the positional items, --resume and --gpus."""
    from lift3d.config import ConfigError, load_config
    from lift3d.config.layers import allow_run_imports

    if getattr(args, "allow_imports", False):
        allow_run_imports()
    paths, overrides = split_configs(args.config)
    if not paths:
        raise ConfigError("no config given: pass a recipe name (lift3d train --list shows them) or a YAML file, e.g. "
                          "lift3d train reconstruct-gaussians-sample")
    paths = [resolve_run_folder(resolve_recipe(path), args) for path in paths]
    command = getattr(args, "command", "train")
    if command != "train" and not getattr(args, "resume", None):
        raise ConfigError(f"lift3d {command} needs a checkpoint: pass --resume outputs/NAME/TAG@TIME/ckpts/last.ckpt "
                          "(or give the run folder instead of the config)")
    overrides = list(extra_overrides or []) + overrides
    if getattr(args, "resume", None):
        overrides.append(f"resume={args.resume}")
    from lift3d.api.overrides import devices_overrides

    overrides += devices_overrides(parse_gpus(getattr(args, "gpus", None)), getattr(args, "nodes", None))
    return load_config(*paths, overrides=overrides), paths, overrides


def add_viewer_arguments(parser: argparse.ArgumentParser) -> None:
    """``--viewer [--viewer-port N] [--viewer-host H]``: the live viewer of a training run (``lift3d.viewer``)."""
    parser.add_argument("--viewer", action="store_true",
                        help="serve a live 3D viewer of the model while it trains (needs pip install 'lift3d[viewer]'); "
                             "its renders take at most viewer.max_share (default 10%%) of the training time")
    parser.add_argument("--viewer-port", type=int, default=None, metavar="PORT", help="the viewer's port (default 8080)")
    parser.add_argument("--viewer-host", default=None, metavar="HOST",
                        help="the viewer's interface (default 127.0.0.1; 0.0.0.0 for the LAN)")


def training_callbacks(cfg: Any, run_dir: Path) -> list[Any]:
    """The callbacks the commands add to a training run (the runner's ``callbacks``): the live viewer when
    ``viewer.enabled`` (--viewer). Off, the viewer is not even imported, so it costs nothing."""
    if not cfg.viewer.enabled:
        return []
    from lift3d.viewer.training import ViewerCallback

    return [ViewerCallback(cfg.viewer, run_dir)]


def viewer_overrides(args: argparse.Namespace) -> list[str]:
    """Config overrides for the viewer flags (none without --viewer)."""
    if not getattr(args, "viewer", False):
        return []
    overrides = ["viewer.enabled=true"]
    if args.viewer_port is not None:
        overrides.append(f"viewer.port={args.viewer_port}")
    if args.viewer_host is not None:
        overrides.append(f"viewer.host={args.viewer_host}")
    return overrides

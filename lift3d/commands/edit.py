"""``lift3d edit RUN "instruction" [--editor instruct-pix2pix|analytic] [overrides...]``: edit a reconstruction."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from lift3d.commands.common import add_allow_imports_argument

HELP = ("edit a finished reconstruction with a text instruction (Instruct-NeRF2NeRF: InstructPix2Pix re-edits the "
        "training views while the scene trains on them); writes a new run next to the source run")
EDITORS = {"instruct-pix2pix": "", "analytic": "-analytic"}  # --editor -> recipe suffix
METHODS = {"reconstruct-gaussians": "gaussians", "reconstruct-nerf": "nerf", "edit-gaussians": "gaussians",
           "edit-nerf": "nerf"}  # source system type -> what is edited
SOURCE_DROPS = ("resume", "tag", "name", "output_root")  # keys of the source run's config that the edit run sets itself
EDIT_KEYS = ("editor", "editor_type", "geometry_convert_from")  # an edit run used as a source: its own edit settings go


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("run", metavar="RUN", help="a finished lift3d reconstruct run folder (outputs/<name>/<tag>@<time>/), "
                                                   "a checkpoint inside one, or the folder above (its newest reconstruction)")
    parser.add_argument("instruction", metavar="INSTRUCTION", nargs="?", default="",
                        help='the edit, e.g. "make it look like bronze"')
    parser.add_argument("config", nargs="*", metavar="KEY=VALUE",
                        help="config overrides, e.g. trainer.max_steps=3000 system.editor.guidance_scale=10")
    parser.add_argument("--editor", choices=list(EDITORS), default="instruct-pix2pix",
                        help="instruct-pix2pix (diffusion weights) or analytic (an offline color transform; default: "
                             "instruct-pix2pix)")
    parser.add_argument("--gpus", metavar="IDS", default=None, help="comma-separated GPU ids, e.g. 0")
    add_allow_imports_argument(parser)


def source_run(path: str) -> tuple[Path, Path, Path]:
    """(run folder, its configs/parsed.yaml, the checkpoint to start from) of RUN: a run folder (its
    ckpts/last.ckpt) or a checkpoint inside one; anything else is a clear error."""
    from lift3d.config import ConfigError

    given = Path(path).expanduser()
    if not given.exists():
        raise FileNotFoundError(f"no run at {given}: give the folder lift3d reconstruct wrote, e.g. "
                                "outputs/reconstruct-gaussians/<scene>@<time>")
    if given.is_file():
        run_dir, checkpoint = given.resolve().parent.parent, given.resolve()
        if given.suffix != ".ckpt" or given.parent.name != "ckpts":
            raise ConfigError(f"{given} is not a run folder or a checkpoint in one (<run>/ckpts/x.ckpt): give the folder "
                              "lift3d reconstruct wrote")
    else:
        run_dir = given.resolve()
        if not (run_dir / "configs" / "parsed.yaml").is_file() and (newest := newest_reconstruction(run_dir)) is not None:
            print(f"lift3d: {given} holds runs: editing the newest reconstruction, {newest.name}", flush=True)
            run_dir = newest
        checkpoint = run_dir / "ckpts" / "last.ckpt"
    parsed = run_dir / "configs" / "parsed.yaml"
    if not parsed.is_file():
        raise ConfigError(f"{given} is not a lift3d run folder (it has no configs/parsed.yaml): give the folder "
                          "lift3d reconstruct wrote, e.g. outputs/reconstruct-gaussians/<scene>@<time> (or the folder "
                          "above it, for its newest reconstruction)")
    if not checkpoint.is_file():
        raise ConfigError(f"{run_dir} has no checkpoint to start from ({checkpoint} is missing): let the reconstruction "
                          "finish, or give one of its checkpoints (RUN/ckpts/stepNNNNNNN.ckpt)")
    return run_dir, parsed, checkpoint


def newest_reconstruction(folder: Path) -> Path | None:
    """The run in ``folder`` (e.g. ``outputs/reconstruct-gaussians``) whose last checkpoint is newest among the
    reconstructions there (edit runs beside them and runs marked failed are skipped), or None."""
    from omegaconf import OmegaConf

    from lift3d.runs.run_dirs import is_failed

    runs = []
    for run in folder.iterdir() if folder.is_dir() else []:
        parsed, last = run / "configs" / "parsed.yaml", run / "ckpts" / "last.ckpt"
        if not (parsed.is_file() and last.is_file()) or is_failed(run):
            continue
        if str(OmegaConf.load(parsed).get("system_type", "")).startswith("reconstruct-"):
            runs.append((last.stat().st_mtime, run))
    return max(runs)[1] if runs else None


def source_layer(parsed: Path, folder: Path) -> tuple[Path, dict[str, Any], str]:
    """The source run's config as the first layer of the edit run (its photos, representation and settings,
    less what the edit run sets itself), written to ``folder/source-run.yaml``; with it the config dict and
    what is edited (gaussians or nerf). A run that is not a reconstruction is a ConfigError."""
    from omegaconf import OmegaConf

    from lift3d.config import ConfigError

    source = OmegaConf.to_container(OmegaConf.load(parsed), resolve=False)
    kind = str(source.get("system_type", ""))
    if kind not in METHODS:
        raise ConfigError(f"{parsed.parent.parent} is a {kind or 'unknown'} run, not a reconstruction: lift3d edit "
                          "edits what lift3d reconstruct made (reconstruct-gaussians or reconstruct-nerf runs)")
    for key in SOURCE_DROPS:
        source.pop(key, None)
    for key in EDIT_KEYS:
        source.get("system", {}).pop(key, None)
    layer = folder / "source-run.yaml"
    layer.write_text(OmegaConf.to_yaml(OmegaConf.create(source)))
    return layer, source, METHODS[kind]


def edit_overrides(run_dir: Path, checkpoint: Path, instruction: str) -> list[str]:
    """Where the edit run goes (next to the source run: same output root and name, tag ``<scene>-edit-<words>``),
    what it starts from and the instruction (quoted, so any characters survive the dotlist parser)."""
    from lift3d.api.generate import prompt_tag
    from lift3d.config import ConfigError

    if not instruction.strip() or "=" in instruction.split()[0]:  # missing, or an override where it goes
        raise ConfigError(f"give the edit instruction after the run, e.g. lift3d edit {run_dir} \"make it look like bronze\"")
    scene = str(run_dir.name).split("@")[0] or "run"
    return [f"output_root={json.dumps(str(run_dir.parent.parent))}", f"name={json.dumps(run_dir.parent.name)}",
            f"tag={scene}-edit-{prompt_tag(instruction, limit=40)}",
            f"system.geometry_convert_from={json.dumps(str(checkpoint))}",
            f"system.editor.prompt={json.dumps(instruction)}"]


def run(args: argparse.Namespace) -> int:
    import torch

    from lift3d.api.run import Run
    from lift3d.commands.common import parse_gpus, training_callbacks
    from lift3d.commands.reconstruct import summary
    from lift3d.config import load_config
    from lift3d.recipes import recipe_config
    from lift3d.runs.runner import run_experiment

    run_dir, parsed, checkpoint = source_run(args.run)
    from lift3d.config.layers import allow_run_imports, refuse_imports

    if args.allow_imports:
        allow_run_imports()  # the edit system reads the source run's config again
    else:  # the source run's config may list plugin code; a run folder may be someone else's
        from omegaconf import OmegaConf

        refuse_imports(list(OmegaConf.load(parsed).get("imports") or []), str(parsed))
    overrides = [item for item in args.config if "=" in item]
    stray = [item for item in args.config if "=" not in item]
    if stray:
        from lift3d.config import ConfigError

        raise ConfigError(f"overrides are KEY=VALUE, got {' '.join(stray)} (quote the instruction if it has spaces)")
    gpus = parse_gpus(args.gpus)
    if gpus is not None:
        overrides = [f"trainer.devices=[{','.join(map(str, gpus))}]", "trainer.accelerator=gpu", *overrides]
    with tempfile.TemporaryDirectory(prefix="lift3d-edit-") as folder:
        layer, _, method = source_layer(parsed, Path(folder))
        recipe = recipe_config(f"edit-{method}{EDITORS[args.editor]}")
        overrides = edit_overrides(run_dir, checkpoint, args.instruction) + overrides
        cfg = load_config(layer, recipe, overrides=overrides)
        if args.editor == "analytic":
            print("lift3d: the analytic editor applies the color transform of the recipe "
                  f"({recipe.name}); the instruction only names the run", flush=True)
        elif gpus is None and not torch.cuda.is_available():
            print("lift3d: no CUDA GPU: InstructPix2Pix edits will be slow on the CPU", flush=True)
        print(f"lift3d: editing {run_dir} ({method}) with {args.editor}: \"{args.instruction}\"", flush=True)
        new_run = run_experiment("train", cfg, [layer, recipe], overrides, callbacks=training_callbacks)
    print("\n".join(summary(Run(new_run))))
    return 0

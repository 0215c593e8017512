"""``lift3d generate "PROMPT" [--method gaussian-sds|dreamfusion|prolificdreamer] [overrides...]``: text -> 3D."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

HELP = "make a 3D asset from a text prompt by score distillation (needs Stable Diffusion weights; a GPU is advised)"
METHODS = {  # --method -> recipe config
    "gaussian-sds": "gaussian-sds",
    "dreamfusion": "dreamfusion-sd",
    "prolificdreamer": "prolificdreamer",
}


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("prompt", help='what to make, e.g. "a DSLR photo of a hamburger"')
    parser.add_argument("config", nargs="*", metavar="KEY=VALUE",  # "config": lift3d.cli appends stray overrides there
                        help="config overrides such as trainer.max_steps=500 system.guidance.guidance_scale=50")
    parser.add_argument("--method", choices=list(METHODS), default="gaussian-sds",
                        help="recipe: gaussian-sds (3D Gaussians, minutes), dreamfusion (NeRF + SDS) or "
                             "prolificdreamer (NeRF + VSD, slowest, most detail); default: gaussian-sds")
    parser.add_argument("--gpus", metavar="IDS", default=None, help="comma-separated GPU ids, e.g. 0")


def prompt_tag(prompt: str, limit: int = 48) -> str:
    """A folder-safe tag from the prompt: ``"A DSLR photo of a hamburger!"`` -> ``a_DSLR_photo_of_a_hamburger``."""
    words = re.sub(r"[^A-Za-z0-9]+", "_", prompt).strip("_")
    return words[:limit].rstrip("_") or "prompt"


def generate_overrides(prompt: str, overrides: list[str]) -> list[str]:
    """The overrides ``lift3d generate`` adds before the user's (which win): the prompt (quoted, so any
    characters survive the dotlist parser) and a trial tag made from it."""
    from lift3d.config import ConfigError

    if not prompt.strip():
        raise ConfigError('give a prompt: lift3d generate "a DSLR photo of a hamburger"')
    bad = [item for item in overrides if "=" not in item]
    if bad:
        raise ConfigError(f"overrides are KEY=VALUE, got {' '.join(bad)} (quote the prompt if it has spaces)")
    return [f"system.guidance.prompt={json.dumps(prompt)}", f"tag={prompt_tag(prompt)}", *overrides]


def run(args: argparse.Namespace) -> int:
    from lift3d.commands.common import parse_gpus
    from lift3d.config import load_config
    from lift3d.recipes import recipe_config
    from lift3d.runner import run_experiment

    config: Path = recipe_config(METHODS[args.method])
    overrides = generate_overrides(args.prompt, list(args.config))
    gpus = parse_gpus(args.gpus)
    if gpus is not None:
        overrides += [f"trainer.devices=[{','.join(map(str, gpus))}]", "trainer.accelerator=gpu"]
    cfg = load_config(config, overrides=overrides)
    print(f"lift3d: generating {args.prompt!r} with {args.method} ({config.name}, {cfg.trainer.max_steps} steps)", flush=True)
    trial = run_experiment("train", cfg, [config], overrides)
    print(f"lift3d: results in {trial}")
    for path in sorted((trial / "save").glob("it*.*")):
        print(f"  {path}")
    return 0

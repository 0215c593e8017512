"""``lift3d generate "PROMPT" [--method METHOD] [overrides...]``: text -> 3D; ``lift3d generate --image PHOTO [--method
METHOD] ["PROMPT"]``: one photo -> 3D; ``lift3d generate --prompts FILE``: one asset per line of FILE, sharded across the
GPUs (``lift3d.commands.multi_prompt``). A thin layer over ``lift3d.generate``; the methods are ``lift3d.method_table``'s.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from lift3d.method_table import IMAGE, TEXT, default_method, method_names, methods

HELP = ("make a 3D asset from a text prompt, or from one photo (--image), by score distillation (needs Stable "
        "Diffusion / Zero123 weights; a GPU is advised) or a feed-forward model (TripoSR)")


def _method_help() -> str:
    def listing(task: str) -> str:
        return "; ".join(f"{m.name}: {m.description}" for m in methods(task))

    return (f"text (default {default_method(TEXT).name}): {listing(TEXT)} | --image (default "
            f"{default_method(IMAGE).name}): {listing(IMAGE)}")


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    from lift3d.commands.common import add_device_arguments, add_viewer_arguments
    from lift3d.commands.multi_prompt import PROMPTS_HELP

    parser.add_argument("prompt", nargs="?", default=None, help='what to make, e.g. "a DSLR photo of a hamburger"')
    parser.add_argument("config", nargs="*", metavar="KEY=VALUE",  # "config": lift3d.cli appends stray overrides there
                        help="config overrides such as trainer.max_steps=500 system.guidance.guidance_scale=50")
    parser.add_argument("--method", choices=[*method_names(TEXT), *method_names(IMAGE)], default=None,
                        help=_method_help().replace("%", "%%"))
    parser.add_argument("--image", metavar="PHOTO", default=None,
                        help="make the asset from this photo (RGBA cut-out, or a photo whose background is removed)")
    parser.add_argument("--elevation", type=float, default=0.0, metavar="DEG",
                        help="--image: the photo's camera elevation above the object's horizon, degrees (default 0)")
    parser.add_argument("--refine", action="store_true",
                        help="also run the method's refine stages (triposr: Zero123 refinement; gaussian-sds, dreamfusion, "
                             "prolificdreamer: their mesh stages)")
    parser.add_argument("--refine-steps", type=int, default=None, metavar="N",
                        help="steps of every stage after the first (default: each recipe's; 0 runs only the first stage)")
    parser.add_argument("--refine-set", action="append", default=[], metavar="KEY=VALUE",
                        help="an override for the stages after the first only (repeatable), e.g. "
                             "system.export.texture_size=2048")
    add_device_arguments(parser)
    parser.add_argument("--prompts", metavar="FILE", default=None, help=PROMPTS_HELP)
    parser.add_argument("--report", metavar="FILE", default=None, help=argparse.SUPPRESS)  # JSON of the result (--prompts)
    add_viewer_arguments(parser)


def print_assets(run) -> None:
    for path in sorted((Path(run.path) / "save").glob("it*.*")):
        print(f"  {path}")


def run(args: argparse.Namespace) -> int:
    from lift3d.api import generate
    from lift3d.commands.common import training_callbacks, viewer_overrides
    from lift3d.config import ConfigError

    prompt, user = args.prompt, list(args.config)
    if prompt and re.fullmatch(r"[A-Za-z_][\w.\\]*=.*", prompt) and (args.image or args.prompts):
        user.insert(0, prompt)  # argparse hands the first override to the optional prompt
        prompt = None
    if args.prompts:
        from lift3d.commands.multi_prompt import run_prompt_list

        if args.viewer:
            raise ConfigError("--viewer shows one run; it does not go with --prompts (view a finished asset with "
                              "lift3d view RUN)")
        return run_prompt_list(args)
    bad = [item for item in user if "=" not in item]
    if bad:
        raise ConfigError(f"overrides are KEY=VALUE, got {' '.join(bad)} (quote the prompt if it has spaces)")
    if args.image is None and prompt is None:
        raise ConfigError('give a prompt: lift3d generate "a DSLR photo of a hamburger" (or --prompts FILE, or --image PHOTO)')
    result = generate(prompt, image=args.image, method=args.method, elevation=args.elevation, refine=args.refine,
                      refine_steps=args.refine_steps, refine_overrides=args.refine_set, gpus=args.gpus, nodes=args.nodes,
                      overrides=[*viewer_overrides(args), *user], callbacks=training_callbacks)
    print_assets(result)
    if args.report:
        Path(args.report).write_text(json.dumps({"run_dir": str(result.path), "stages": [str(s.path) for s in result.stages],
                                                 "files": [str(p) for p in result.files]}))
    return 0

"""``lift3d app``: the web app (prompt or photos in, live progress, 3D result in the browser)."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

HELP = "start the web app: a page to run recipes from a prompt or photos and see the 3D result"


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default: localhost only; 0.0.0.0 for the LAN: then each browser sees only "
                             "the jobs it started)")
    parser.add_argument("--port", type=int, default=7860, help="port to serve on (default: 7860)")
    parser.add_argument("--share", action="store_true", help="also open a public Gradio share link (off by default)")
    parser.add_argument("--output-root", default="outputs", metavar="DIR",
                        help="where runs write their runs (default: outputs)")
    parser.add_argument("--recipes", nargs="+", default=[], metavar="YAML",
                        help="extra app recipe files (a YAML list of label/config/input/options entries); "
                             "$LIFT3D_APP_RECIPES adds more")
    parser.add_argument("--max-upload-gb", type=float, default=2.0, metavar="GB",
                        help="largest upload accepted, unpacked (a .zip counts by what it unpacks to; default: 2)")
    parser.add_argument("--gpus", default=None, metavar="IDS",
                        help="comma-separated GPU ids to run jobs on, one job per GPU at a time (default: every visible "
                             "GPU, else CPU)")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM shuts down like Ctrl-C: jobs are canceled, their checkpoints stay


def run(args: argparse.Namespace) -> int:
    try:
        import gradio  # noqa: F401
    except ImportError:
        print("lift3d: error: the web app needs gradio: pip install 'lift3d[app]'", file=sys.stderr)
        return 2
    from lift3d.app.jobs import JobQueue
    from lift3d.app.recipes import offered_recipes, recipe_table
    from lift3d.app.ui import launch
    from lift3d.commands.common import parse_gpus
    from lift3d.config import ConfigError

    if not 0 < args.max_upload_gb < float("inf"):
        raise ConfigError(f"--max-upload-gb must be a positive number of GiB, got {args.max_upload_gb}")
    gpus = parse_gpus(args.gpus)
    queue = JobQueue([f"cuda:{i}" for i in gpus] if gpus else None)
    on_cpu = not any(slot.startswith("cuda") for slot in queue.slots)  # the recipes' CPU variants where jobs run on the CPU
    recipes = offered_recipes(recipe_table(files=args.recipes, on_cpu=on_cpu))
    if not recipes:
        print("lift3d: no recipe config is installed yet; the page will say so")
    print(f"lift3d: {len(recipes)} recipe(s); jobs run one at a time on each of: {', '.join(queue.slots)}", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    launch(queue, recipes, Path(args.output_root), host=args.host, port=args.port, share=args.share,
           max_upload_bytes=int(args.max_upload_gb * 2**30))
    return 0

"""``lift3d view RUN_OR_FILE [--port 8080] [--host 127.0.0.1]``: a finished run, any Gaussian file lift3d reads (the
reader of ``lift3d export``) or a mesh in the browser (viser), rendered by lift3d's own renderers from the browser's camera."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from lift3d.commands.common import add_allow_imports_argument

log = logging.getLogger("lift3d.view")

# the Gaussian suffixes are those of lift3d.gaussians.formats.files (tests/commands/test_view_formats.py checks them)
SOURCE_HELP = ("a run folder, a .ckpt in one, a Gaussian file (.ply, .splat, .spz, .sog, .ksplat, KHR_gaussian_splatting "
               ".glb, a streamed SOG's lod-meta.json or its folder) or a mesh (.glb, .gltf, .obj)")
HELP = ("open a run folder (its last checkpoint: NeRF, Gaussians or mesh), a Gaussian file (.ply, .splat, .spz, .sog, "
        ".ksplat, KHR_gaussian_splatting .glb, a streamed SOG's lod-meta.json or its folder) or a mesh .glb/.gltf/.obj in "
        "a browser viewer (render modes, training "
        "cameras, a camera-path recorder for lift3d render); needs pip install 'lift3d[viewer]'")


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument("source", metavar="RUN_OR_FILE", help=SOURCE_HELP)
    parser.add_argument("--port", type=int, default=8080,
                        help="port of the viewer page (default 8080; the next free one if taken)")
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1; 0.0.0.0 for the LAN)")
    parser.add_argument("--max-side", type=int, default=None, metavar="PX",
                        help="longest side of a still view's render (default 1024 on a GPU, 512 on the CPU)")
    parser.add_argument("--device", default=None, help="where to render: cuda or cpu (default: cuda when available)")
    add_allow_imports_argument(parser)


def serve(server, model, device, should_stop=lambda: False) -> None:
    """Answer the page until interrupted: render each browser's view small while it moves, full once it stops."""
    from lift3d.viewer.models import render_picture

    while not should_stop():
        job = server.next_job()
        if job is None:
            time.sleep(0.02)
            continue
        server.show(job, render_picture(model, job.cameras, job.mode, device))


def run(args: argparse.Namespace) -> int:
    import torch

    from lift3d.config import ConfigError, ViewerConfig
    from lift3d.viewer.models import home_camera, load_view_model
    from lift3d.viewer.server import ViewerServer, require_viser

    require_viser()  # before loading a large model
    if not 0 <= args.port < 65536:
        raise ConfigError(f"--port must be 0..65535, got {args.port}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    max_side = args.max_side or (1024 if device.type == "cuda" else 512)
    model = load_view_model(args.source, device, allow_imports=args.allow_imports)
    cfg = ViewerConfig(enabled=True, host=args.host, port=args.port, max_side=max_side,
                       preview_max_side=min(256, max_side), refresh_seconds=0.0)
    server = ViewerServer(cfg, model.name, model.folder, home=model.home or home_camera(model.training_views),
                          source=Path(args.source).expanduser().resolve())
    if model.training_views is not None:
        server.show_training_views(model.training_views)
    gaussians = getattr(model.system, "gaussians", None)
    if gaussians is not None:
        server.set_stats(f"Gaussians **{len(gaussians):,}**")
    print(f"lift3d: viewer of {args.source} at {server.url} (Ctrl+C stops it)", flush=True)
    try:
        serve(server, model, device)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0

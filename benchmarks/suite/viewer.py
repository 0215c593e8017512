"""What the live viewer costs training: reconstruct-gaussians on NeRF-synthetic lego (400x400), steps/s with the
viewer off and with it on and one client connected but idle, in the same process; prints one JSON line.

The idle client is a real websocket client of the viser server (what a browser tab opens) whose camera was set once,
as a browser's is on connecting; the viewer then renders that view (small, then full size) and re-renders it every
viewer.refresh_seconds as the model trains, within viewer.max_share of the training time. Both runs train the same
seeded schedule; steps/s is timed from --warmup to --steps (the GPU synchronized at both ends only).

    python -m benchmarks viewer --data PATH/TO/lego            # GPU: gsplat backend
    python -m benchmarks viewer --device cpu --steps 60 --warmup 20 system.gaussians.init_points=2000

Needs viser (pip install 'lift3d[viewer]'; its wheels: viser and tqdm/requests/... are pure Python, msgspec,
zstandard and websockets are binary wheels for the machine's Python).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import threading
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from benchmarks.records import device_name
from benchmarks.suite.lego_gaussians import default_data
from benchmarks.timing import sync
from lift3d.cameras import look_at
from lift3d.commands.common import training_callbacks
from lift3d.config import load_config
from lift3d.recipes import recipe_config
from lift3d.runs.run_dirs import make_run_dir
from lift3d.runs.runner import build_parts, build_trainer


class StepTimer(Callback):
    """Wall time from the end of step ``warmup`` to the end of the last step, the device synchronized at both ends."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.start, self.seconds, self.steps = warmup, None, 0.0, 0

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if step == self.warmup:
            sync(module.device)
            self.start, self.first = time.perf_counter(), step
        elif step == trainer.max_steps and self.start is not None:
            sync(module.device)
            self.seconds, self.steps = time.perf_counter() - self.start, step - self.first


class IdleClient(Callback):
    """A websocket client of the viewer (after its server started) that sends one camera message, as a browser tab
    does when it loads the page, then reads and drops whatever it is sent (background images, stats) and stays idle."""

    def __init__(self, viewer) -> None:
        self.viewer, self.received, self._socket = viewer, 0, None

    def on_train_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        import msgspec
        import viser
        from viser import _messages
        from websockets.sync.client import connect

        from lift3d.viewer.camera_math import c2w_to_viser_pose

        server = self.viewer.server
        self._socket = connect(f"ws://127.0.0.1:{server.port}", subprotocols=[f"viser-v{viser.__version__}"], max_size=None)
        threading.Thread(target=self._drain, daemon=True).start()
        c2w = look_at(torch.tensor([2.8, -2.8, 2.3]), torch.zeros(3), torch.tensor([0.0, 0.0, 1.0]))
        wxyz, position = (tuple(float(v) for v in x) for x in c2w_to_viser_pose(c2w.double()))
        camera = _messages.ViewerCameraMessage(wxyz, position, fov=math.radians(50), near=0.01, far=100.0, image_height=800,
                                               image_width=1280, look_at=(0.0, 0.0, 0.0), up_direction=(0.0, 0.0, 1.0))
        self._socket.send(msgspec.msgpack.encode(camera.as_serializable_dict()))
        deadline = time.monotonic() + 30
        while not server.has_clients():
            if time.monotonic() > deadline:
                raise RuntimeError("the viewer never received the client's camera")
            time.sleep(0.05)

    def _drain(self) -> None:
        try:
            while True:
                self._socket.recv()
                self.received += 1
        except Exception:  # noqa: BLE001  (closed with the server)
            return

    def on_fit_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if self._socket is not None:
            self._socket.close()


def train(args: argparse.Namespace, viewer: bool, output: Path) -> dict:
    overrides = [
        f"output_root={output}", f"data.root={args.data}", f"trainer.max_steps={args.steps}", "trainer.val_check_interval=0",
        "trainer.run_test_after_fit=false", "trainer.enable_progress_bar=false", "trainer.log_every_n_steps=500",
        f"trainer.accelerator={'gpu' if args.device.startswith('cuda') else 'cpu'}", "checkpoint.every_n_train_steps=0",
        "checkpoint.save_last=false", "system.nonfinite_check_every=0", "system.export.formats=[]",
        f"tag=viewer-{'on' if viewer else 'off'}", f"viewer.enabled={str(viewer).lower()}", "viewer.port=0",
        f"viewer.max_share={args.max_share}", *args.overrides,
    ]
    cfg = load_config(recipe_config("reconstruct-gaussians"), overrides=overrides)
    run_dir = make_run_dir(cfg)
    trainer = build_trainer(cfg, run_dir, train=True, callbacks=training_callbacks(cfg, run_dir))
    timer = StepTimer(args.warmup)
    trainer.callbacks.append(timer)
    callback = client = None
    if viewer:
        from lift3d.viewer.training import ViewerCallback

        callback = next(c for c in trainer.callbacks if isinstance(c, ViewerCallback))
        client = IdleClient(callback)
        trainer.callbacks.append(client)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule, system = build_parts(cfg)
    trainer.fit(system, datamodule=datamodule)
    result = {"steps_per_s": round(timer.steps / timer.seconds, 2), "timed_steps": timer.steps,
              "seconds": round(timer.seconds, 2), "gaussians": len(system.gaussians)}
    if callback is not None:
        spent = callback.budget.spent if callback.budget is not None else 0.0
        result.update(renders=callback.renders, render_seconds=round(spent, 2), messages_received=client.received)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks viewer",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=default_data(), help="the lego scene folder (transforms_*.json)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=3000, help="training steps of each run")
    parser.add_argument("--warmup", type=int, default=300, help="steps before the clock starts")
    parser.add_argument("--max-share", type=float, default=0.1, help="viewer.max_share of the run with the viewer")
    parser.add_argument("overrides", nargs="*", help="extra config overrides for both runs")
    args = parser.parse_args(argv)
    if not 0 < args.warmup < args.steps:
        parser.error("need 0 < --warmup < --steps")
    output = Path(tempfile.mkdtemp(prefix="lift3d-bench-viewer-"))
    off = train(args, viewer=False, output=output)
    on = train(args, viewer=True, output=output)
    print(json.dumps({
        "bench": "viewer", "device": device_name(args.device),
        "steps": args.steps, "warmup": args.warmup, "max_share": args.max_share,
        "off": off, "on_idle_client": on, "slowdown": round(1 - on["steps_per_s"] / off["steps_per_s"], 4),
        "torch": torch.__version__,
    }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

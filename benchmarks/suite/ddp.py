"""Multi-GPU scaling: views/s of one config on 1 GPU and on N GPUs (DDP), B views per step per rank, and the
validation PSNR at equal views seen, in one call.

Each run is its own process (``--worker``; Lightning starts the other DDP ranks by re-running that command): it trains
``--warmup`` untimed steps then ``--steps`` timed ones with checkpoints and the final test off, reports rank 0's rate
(views/s = steps/s x views per step per rank x ranks) and, with ``--psnr``, validates once after the last step. Runs:
one GPU with B views a step (``--views-per-rank``; 0: the config's data.batch_size), then for each device set of n
GPUs: with ``--same-batch`` one GPU with n x B views a step (the same batch per step, so the same schedule and views
seen: its PSNR is the reference), then the n GPUs with B each. Prints one JSON line: every run and, per device set,
the views/s ratios against one GPU (target 1.8x for two GPUs, 3.2x for four) and the PSNR difference against the
one-GPU run with the same batch (target within 0.2 dB). Progress lines go to stderr.

    # on two GPUs, 2000 steps each: 1 GPU x4 views, 1 GPU x8 views, 2 GPUs x4 views eagerly and with the captured
    # step under DDP (--ddp-graphs both: render, loss, backward replayed; Adam eager after the all-reduce)
    python -m benchmarks ddp --config reconstruct-gaussians --views-per-rank 4 --same-batch --psnr --ddp-graphs both \
        --warmup 100 --steps 1900 --timeout-s 300 data.root=../shared/data/lego "system.export.formats=[]"
    python -m benchmarks ddp --config dreamfusion-sd --random-sd21 /tmp/sd21   # random SD-2.1-shaped weights
    python -m benchmarks ddp --cpu --config tests/configs/fit-image.yaml --steps 6 --warmup 2   # smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DDP_GRAPHS_ENV = "LIFT3D_DDP_CUDA_GRAPHS"  # lift3d.systems.replicas.DDP_GRAPHS_ENV (read there by every rank)


def config_path(name: str) -> Path:
    """A recipe name (configs/<name>.yaml) or a path to a YAML file."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path.resolve()
    from lift3d.recipes import recipe_config

    return recipe_config(name)


def worker(args: argparse.Namespace) -> int:
    """Train on ``args.devices`` and write rank 0's timing to ``args.result``."""
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback

    from lift3d.config import load_config
    from lift3d.runs.runner import build_parts, build_trainer

    cpu = args.cpu
    devices: Any = int(args.devices) if cpu else [int(d) for d in args.devices.split(",")]
    n_devices = devices if cpu else len(devices)
    profile = args.profile if not cpu else 0
    total = args.warmup + args.steps + profile
    validate = f"trainer.val_check_interval={args.warmup + args.steps}" if args.psnr else "trainer.val_check_interval=0"
    batch = [f"data.batch_size={args.batch}"] if args.batch > 0 else []
    overrides = [f"trainer.max_steps={total}", validate, "trainer.run_test_after_fit=false", "trainer.rescale_steps=never",
                 "trainer.enable_progress_bar=false", "checkpoint.every_n_train_steps=0", "checkpoint.save_last=false",
                 f"output_root={args.output}", "use_timestamp=false", f"trainer.accelerator={'cpu' if cpu else 'gpu'}",
                 *args.overrides, *batch]  # the run's batch wins over a data.batch_size among the overrides
    cfg = load_config(config_path(args.config), overrides=overrides)

    from benchmarks.timing import peak_memory_gib
    from benchmarks.timing import sync as sync_device

    def sync() -> None:
        if not cpu:
            sync_device()

    class Timer(Callback):
        """Times steps warmup..warmup+steps on every rank; rank 0 then profiles ``--profile`` more steps."""

        def __init__(self) -> None:
            self.start = self.views = self.seconds = self.window = self.profile = None

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            step = trainer.global_step
            if step == args.warmup:
                sync()
                self.start = time.perf_counter()
            elif step == args.warmup + args.steps and self.start is not None:
                sync()
                self.seconds = time.perf_counter() - self.start
                if profile and trainer.is_global_zero:
                    from benchmarks.profiling import ProfiledSteps

                    self.window = ProfiledSteps().__enter__()
            elif self.window is not None and self.profile is None and step == total:
                self.window.__exit__(None, None, None)
                self.profile = self.window.summary(profile)
            cameras = batch.get("cameras") if isinstance(batch, dict) else None
            self.views = len(cameras) if cameras is not None else 1

        def on_train_end(self, trainer, pl_module) -> None:
            sync()
            if not trainer.is_global_zero or self.start is None:
                return
            seconds = self.seconds if self.seconds is not None else time.perf_counter() - self.start
            steps = min(trainer.global_step, args.warmup + args.steps) - args.warmup
            record = {"devices": n_devices, "world_size": trainer.world_size, "steps": steps, "seconds": round(seconds, 3),
                      "steps_per_s": round(steps / seconds, 3), "views_per_step_per_rank": self.views,
                      "views_per_s": round(steps * self.views * trainer.world_size / seconds, 3),
                      "views_seen": (args.warmup + args.steps) * self.views * trainer.world_size}
            graphs = getattr(pl_module, "_graphs", None)  # the Gaussian recipes' captured step
            if graphs is not None:
                record["graph_captures"] = graphs.captures
            metrics = pl_module.saver.root / "metrics.json"
            if args.psnr and metrics.is_file():  # the one validation, after the last timed step (system's protocol)
                val = json.loads(metrics.read_text()).get("val", {})
                record.update({"val_psnr": round(val["psnr"], 3), "val_ssim": round(val["ssim"], 4), "val_step": val["step"]})
            if torch.cuda.is_available() and not cpu:
                record["peak_mem_gib_rank0"] = peak_memory_gib()
            if self.profile is not None:
                record["profile_rank0"] = self.profile
            Path(args.result).write_text(json.dumps(record))

    run_dir = Path(args.output) / "run_dir"
    trainer = build_trainer(cfg, run_dir, train=True, devices=devices)
    trainer.callbacks.append(Timer())
    L.seed_everything(cfg.seed + trainer.global_rank, workers=True, verbose=False)
    datamodule, system = build_parts(cfg)
    system.set_save_dir(run_dir / "save")
    trainer.fit(system, datamodule=datamodule)
    return 0


def environment(cpu: bool) -> dict[str, Any]:
    """The suite's environment record for the GPU runs (or the CPU smoke test)."""
    import torch

    from benchmarks.records import environment as device_environment

    return device_environment(torch.device("cuda" if not cpu and torch.cuda.is_available() else "cpu"))


def planned_runs(sets: list[str], cpu: bool, views: int, same_batch: bool, ddp_graphs: str) -> list[tuple[str, int, bool]]:
    """(device set, views per step per rank (0: the config's), captured step under DDP) of each run: the first set as
    given, then per later set of n devices the first set with n x ``views`` a step (``same_batch``) and the n devices
    with ``views`` each, eager and/or with the captured step (``ddp_graphs``: off, on or both)."""
    def count(devices: str) -> int:
        return int(devices) if cpu else len(devices.split(","))

    runs = [(sets[0], views, False)]
    for devices in sets[1:]:
        n = count(devices) // count(sets[0])
        if same_batch and views > 0 and n > 1:
            runs.append((sets[0], n * views, False))
        runs.extend((devices, views, graphed) for graphed in {"off": [False], "on": [True], "both": [False, True]}[ddp_graphs])
    return runs


def compare(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run on several devices: its views/s over the first run's (the same views per rank on one device set) and
    over the one-device run with its whole batch per step, and the PSNR difference against that run (equal views seen)."""
    base = records[0] if "views_per_s" in records[0] else None
    rows = []
    for record in records[1:]:
        if "views_per_s" not in record or record["world_size"] <= (base or {}).get("world_size", 1):
            continue
        batch = record["views_per_step_per_rank"] * record["world_size"]
        same = next((r for r in records if "views_per_s" in r and r["world_size"] == (base or r)["world_size"]
                     and r["views_per_step_per_rank"] * r["world_size"] == batch), None)
        row: dict[str, Any] = {"device_set": record["device_set"], "world_size": record["world_size"],
                               "views_per_step_per_rank": record["views_per_step_per_rank"],
                               "ddp_cuda_graphs": record.get("ddp_cuda_graphs", False)}
        if base is not None:
            ratio = record["views_per_s"] / base["views_per_s"]
            target = 1.8 if record["world_size"] == 2 else 3.2 if record["world_size"] == 4 else None
            efficiency = ratio / (record["world_size"] / base["world_size"])
            row.update({"views_per_s_ratio": round(ratio, 3), "scaling_efficiency": round(efficiency, 3),
                        **({"target_met": ratio >= target, "target": target} if target else {})})
        if same is not None and same is not base:
            row["views_per_s_ratio_same_batch"] = round(record["views_per_s"] / same["views_per_s"], 3)
        if same is not None and "val_psnr" in record and "val_psnr" in same and same["views_seen"] == record["views_seen"]:
            row["val_psnr_minus_same_batch_db"] = round(record["val_psnr"] - same["val_psnr"], 3)
            row["psnr_within_0.2db"] = abs(row["val_psnr_minus_same_batch_db"]) <= 0.2
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks ddp", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="dreamfusion-sd", help="recipe name or YAML path")
    parser.add_argument("--steps", type=int, default=300, help="timed steps")
    parser.add_argument("--warmup", type=int, default=50, help="untimed steps first (compilation, occupancy warm-up)")
    parser.add_argument("--device-sets", default="0;0,1", help="';'-separated GPU id lists to compare (CPU: process counts)")
    parser.add_argument("--cpu", action="store_true", help="gloo on the CPU; --device-sets are process counts (default 1;2)")
    parser.add_argument("--views-per-rank", type=int, default=0, metavar="B",
                        help="views per training step on each rank: data.batch_size (0: the config's)")
    parser.add_argument("--same-batch", action="store_true",
                        help="also train one device with n x B views a step for each set of n (the equal-views reference)")
    parser.add_argument("--psnr", action="store_true", help="validate once after the timed steps (val PSNR, SSIM)")
    parser.add_argument("--ddp-graphs", choices=("off", "on", "both"), default="off",
                        help="several devices: the Gaussian step's CUDA graph under DDP (LIFT3D_DDP_CUDA_GRAPHS); "
                             "both: a run each")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile N more steps on rank 0 after the timed ones (benchmarks.profiling; CUDA)")
    parser.add_argument("--timeout-s", type=float, default=280.0, help="limit per run")
    parser.add_argument("--random-sd21", default="", metavar="DIR",
                        help="write (once) a random-weight SD-2.1-base-shaped model to DIR and point system.guidance at it")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--devices", default="", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--result", default="", help=argparse.SUPPRESS)
    parser.add_argument("--output", default="", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value)")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    sets = args.device_sets.split(";") if not (args.cpu and args.device_sets == "0;0,1") else ["1", "2"]
    env = environment(args.cpu)
    if args.random_sd21:
        from benchmarks.stand_ins.random_sd import write_random_sd21

        folder = write_random_sd21(args.random_sd21)
        args.overrides = [f"system.guidance.pretrained_model_name_or_path={folder}",
                          'system.guidance.prompt="a DSLR photo of a hamburger"',
                          *args.overrides]  # the user's overrides come later and win
    records: list[dict[str, Any]] = []
    for devices, batch, graphed in planned_runs(sets, args.cpu, args.views_per_rank, args.same_batch, args.ddp_graphs):
        with tempfile.TemporaryDirectory(prefix="lift3d-bench-ddp-") as tmp:
            result = Path(tmp) / "result.json"
            command = [sys.executable, "-m", "benchmarks.suite.ddp", "--worker", "--config", args.config, "--devices", devices,
                       "--batch", str(batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
                       "--profile", str(args.profile), "--result", str(result), "--output", tmp,
                       *(["--cpu"] if args.cpu else []), *(["--psnr"] if args.psnr else []), *args.overrides]
            record: dict[str, Any] = {"device_set": devices, "ddp_cuda_graphs": graphed}
            run_env = {**os.environ, DDP_GRAPHS_ENV: "1" if graphed else "0"}
            started = time.perf_counter()
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s, cwd=REPO, env=run_env)
                if done.returncode == 0 and result.exists():
                    record.update(json.loads(result.read_text()))
                else:
                    record["error"] = (done.stderr.strip().splitlines() or ["no output"])[-1][:400]
                    print(done.stderr[-3000:], file=sys.stderr)
            except subprocess.TimeoutExpired:
                record["error"] = f"timed out after {args.timeout_s:.0f}s"
            record["wall_s"] = round(time.perf_counter() - started, 1)
        records.append(record)
        print("ddp run:", json.dumps(record), file=sys.stderr, flush=True)
    print(json.dumps({"bench": "ddp", "config": args.config, "views_per_rank": args.views_per_rank, "steps": args.steps,
                      "warmup": args.warmup, "overrides": args.overrides, "runs": records, "comparisons": compare(records),
                      **env}), flush=True)
    return 0 if all("views_per_s" in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())

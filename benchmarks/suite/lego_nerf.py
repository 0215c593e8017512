"""Lego NeRF benchmark: the reconstruct-nerf recipe on NeRF-synthetic lego at 400x400 (val split).

Prints one JSON line per case: PSNR and training wall time at each checkpoint step (5k, 20k by
default; evaluation time excluded), render throughput (rays/s) at 64^2 and 512^2, a profile of one
training step (top ops by device time) and an arithmetic/bandwidth floor estimate of that step.
Training stops early at --train-budget seconds so the whole run stays within ~8 minutes; a case then
reports the step it reached. With ``--reference plain`` the same recipe is then trained again by a plain loop
over the project's own renderer and optimizer without Lightning (``reference.plain_nerf``), in the same process, so the
two are compared side by side; ``--reference eager`` trains the recipe again with its step not captured as a CUDA
graph (``system.cuda_graphs=false``). Everything printed also goes to $OUT/lego_nerf.log when $OUT is set.

    python -m benchmarks lego_nerf --data ../shared/data/lego
    python -m benchmarks lego_nerf --data ../shared/data/lego --steps 2000,5000 --train-budget 120 --reference plain
    python -m benchmarks lego_nerf --data ../shared/data/lego --steps 1000,2000,5000 --reference eager
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

from benchmarks.records import device_name
from benchmarks.timing import Stopwatch, sync

REPO = Path(__file__).resolve().parents[2]

_LOG = None


def emit(record: dict) -> None:
    """One JSON line to stdout (and to $OUT/lego_nerf.log)."""
    line = json.dumps(record, sort_keys=True)
    print(line, flush=True)
    if _LOG is not None:
        _LOG.write(line + "\n")
        _LOG.flush()


def note(text: str) -> None:
    print(text, flush=True)
    if _LOG is not None:
        _LOG.write(text + "\n")
        _LOG.flush()


def versions() -> dict:
    info = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    info["device"] = device_name("cuda" if torch.cuda.is_available() else "cpu")
    return info


@torch.no_grad()
def evaluate(system, datamodule, max_views: int) -> dict:
    """Mean PSNR/SSIM over the val views (white background), rendered one view at a time."""
    from lift3d.metrics import psnr, ssim

    was_training = system.training
    system.eval()
    views = datamodule._views(datamodule.val_scene())
    if max_views > 0:
        views = views[:max_views]
    scores = []
    device = system.device
    with Stopwatch(device) as clock:
        for view in views:
            out = system.renderer(view["cameras"].to(device), background=view["background"].to(device))
            prediction = out["rgb"].clamp(0, 1)
            target = view["rgb"].to(device)
            scores.append(torch.stack([psnr(prediction, target), ssim(prediction, target)], -1))
    system.train(was_training)
    mean = torch.cat(scores).mean(0).tolist()
    return {"psnr": mean[0], "ssim": mean[1], "views": len(views), "eval_s": clock.seconds}


def make_callback(datamodule, checkpoints: list[int], budget_s: float, eval_views: int, results: list, name: str):
    import lightning as L

    class Checkpoints(L.Callback):
        """Times training (evaluation excluded), evaluates at checkpoint steps, stops at the time budget."""

        def __init__(self) -> None:
            self.train_s = 0.0
            self.mark = None
            self.pending = sorted(checkpoints)
            self.step_times: list[tuple[int, float]] = []

        def on_train_start(self, trainer, module) -> None:
            sync()
            self.mark = time.perf_counter()

        def _stop_clock(self) -> None:
            sync()
            self.train_s += time.perf_counter() - self.mark

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
            step = trainer.global_step
            over = (time.perf_counter() - self.mark) + self.train_s > budget_s if step % 50 == 0 else False
            if not (self.pending and step >= self.pending[0]) and not over:
                return
            self._stop_clock()
            target = self.pending[0] if self.pending else step
            scores = evaluate(module, datamodule, eval_views)
            renderer = module.renderer
            captured = getattr(module, "_captured", None)
            record = {"name": f"{name}_{target}_steps", "target_steps": target, "steps": step,
                      "graph_captures": captured.captures if captured else 0,
                      "graph_replays": captured.replays if captured else 0,
                      "train_wall_s": round(self.train_s, 2), "ms_per_step": round(1000 * self.train_s / max(step, 1), 3),
                      "occupancy": float(renderer.occupancy.occupancy_fraction()),
                      "hash_backend": "triton" if module.field.encoding._triton_checked else "torch",
                      "samples_per_ray": dict(renderer._per_ray), **{k: round(v, 4) for k, v in scores.items()},
                      "stopped_by_time_budget": bool(over and step < target)}
            results.append(record)
            note(f"checkpoint (emitted with the versions after training): {json.dumps(record, sort_keys=True)}")
            if self.pending and step >= self.pending[0]:
                self.pending.pop(0)
            if over or not self.pending:
                trainer.should_stop = True
            sync()
            self.mark = time.perf_counter()

    return Checkpoints()


@torch.no_grad()
def throughput(system, datamodule, size: int, frames: int) -> dict:
    system.eval()
    cameras = datamodule.val_scene().cameras[:1].resized(size, size).to(system.device)
    background = torch.ones(1, 3, device=system.device)
    system.renderer(cameras, background=background)  # warm-up
    sync()
    all_cameras = datamodule.val_scene().cameras
    views = [all_cameras[i % len(all_cameras)].resized(size, size).to(system.device) for i in range(frames)]
    with Stopwatch(system.device) as clock:
        for view in views:
            system.renderer(view, background=background)
    seconds = clock.seconds / frames
    return {"name": f"lego_nerf_render_{size}", "resolution": size, "frames": frames, "ms_per_frame": round(1000 * seconds, 2),
            "rays_per_s": round(size * size / seconds)}


def profile_step(system, datamodule, optimizer, n_steps: int = 3) -> tuple[dict, list[dict]]:
    """Profile plain training steps (renderer + loss + backward + Adam) outside Lightning."""
    from torch.profiler import ProfilerActivity, profile

    system.train()
    device = system.device

    def batch(step):
        b = datamodule._sample_rays(100000 + step, torch.Generator().manual_seed(step))
        return {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in b.items()}

    def step(b):
        out = system.renderer.render_rays(b["rays_o"], b["rays_d"], background=b["background"])
        loss = ((out["rgb"] - b["rgb"]) ** 2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return out

    for i in range(5):
        step(batch(i))
    with Stopwatch(device) as clock:
        for i in range(20):
            out = step(batch(10 + i))
    plain_ms = clock.seconds / 20 * 1000
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        for i in range(n_steps):
            out = step(batch(50 + i))
        sync()
    sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=25)
    note(table)

    def device_us(event) -> float:
        return getattr(event, "device_time_total", getattr(event, "cuda_time_total", 0))

    rows = []
    for event in sorted(prof.key_averages(), key=lambda e: -device_us(e))[:15]:
        rows.append({"op": event.key[:60], "device_ms_per_step": round(device_us(event) / 1000 / n_steps, 3),
                     "cpu_ms_per_step": round(event.self_cpu_time_total / 1000 / n_steps, 3),
                     "calls_per_step": event.count // n_steps})
    record = {"name": "lego_nerf_step_profile", "plain_loop_ms_per_step": round(plain_ms, 3),
              "samples_per_step": float(out["num_samples"]), "rays_per_step": int(b_rays(datamodule)), "top_ops": rows}
    return record, rows


def b_rays(datamodule) -> int:
    return datamodule.cfg.rays_per_batch


def floor_estimate(system, samples: float, first_pass: float, rays: int) -> dict:
    """Bytes and FLOPs a perfectly fused step would need (H100: ~3.35 TB/s HBM, ~400 TFLOP/s TF32 dense)."""
    layout = system.field.encoding.layout
    levels, features = layout.n_levels, layout.n_features
    table_params = layout.n_rows * features
    mlp_params = sum(p.numel() for p in system.field.mlp.parameters()) + sum(p.numel() for p in system.material.parameters())
    gather_bytes = 32 * levels * 8  # one 32-byte sector per corner (random access), fwd
    hash_bytes = samples * (3 * gather_bytes + 2 * 4 * levels * features) + first_pass * gather_bytes
    mlp_flops = 2 * mlp_params * (3 * samples) + 2 * sum(p.numel() for p in system.field.mlp.parameters()) * first_pass
    activation_bytes = samples * 4 * 2 * (levels * features + 64 * 4 + 16 + 31) * 2  # write + read back, fwd + bwd
    adam_bytes = (table_params + mlp_params) * 4 * 7  # param, grad, m, v read + param, m, v write
    march_bytes = rays * system.renderer.diagonal / system.renderer.step_size * 16
    total_bytes = hash_bytes + activation_bytes + adam_bytes + march_bytes
    return {"name": "lego_nerf_step_floor", "samples": samples, "first_pass_samples": first_pass,
            "hash_grid_GB": round(hash_bytes / 1e9, 3), "activations_GB": round(activation_bytes / 1e9, 3),
            "adam_GB": round(adam_bytes / 1e9, 3), "marching_GB": round(march_bytes / 1e9, 3),
            "mlp_GFLOP": round(mlp_flops / 1e9, 2),
            "floor_ms_at_3.35TBps": round(total_bytes / 3.35e12 * 1000, 3)}


def main(argv: list[str] | None = None) -> int:
    global _LOG
    parser = argparse.ArgumentParser(prog="python -m benchmarks lego_nerf", description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(REPO.parent / "shared" / "data" / "lego"), help="lego scene folder")
    parser.add_argument("--steps", default="5000,20000", help="checkpoint steps (comma separated)")
    parser.add_argument("--train-budget", type=float, default=330.0, help="seconds of training before stopping early")
    parser.add_argument("--eval-views", type=int, default=-1, help="val views scored at each checkpoint (-1: all)")
    parser.add_argument("--rays", type=int, default=8192, help="rays per training step")
    parser.add_argument("--skip-profile", action="store_true", help="skip the profile and floor cases")
    parser.add_argument("--reference", default="none",
                        help="comma separated: plain (also train the recipe by a plain loop without Lightning or CUDA graph, "
                             "reference.plain_nerf), eager (the recipe again with system.cuda_graphs=false); same checkpoints")
    parser.add_argument("overrides", nargs="*", help="extra config overrides (key=value)")
    args = parser.parse_args(argv)
    out_dir = os.environ.get("OUT")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        _LOG = open(Path(out_dir) / "lego_nerf.log", "a")  # noqa: SIM115 - kept open for the whole run
    import logging

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    env = versions()
    note(f"lego_nerf: {env}")
    try:
        return run(args, env)
    except Exception:
        note(traceback.format_exc())
        emit({"name": "lego_nerf_error", "error": traceback.format_exc().splitlines()[-1], **env})
        return 1


def speed_ratio(reference: dict, results: list[dict]) -> float | None:
    """How many times faster the recipe ran than ``reference`` to the same checkpoint (ms a step, reference / recipe)."""
    recipe = next((r for r in results if r["target_steps"] == reference["target_steps"]), None)
    return None if recipe is None else round(reference["ms_per_step"] / recipe["ms_per_step"], 3)


def train_recipe(cfg, run_dir: Path, checkpoints: list[int], args, name: str) -> tuple:
    """Train the recipe ``cfg`` through the CLI's trainer, scoring at the checkpoint steps -> (system, data, records)."""
    import lightning as L

    from lift3d.runs.runner import build_parts, build_trainer

    start = time.perf_counter()
    trainer = build_trainer(cfg, run_dir, train=True)
    L.seed_everything(cfg.seed, verbose=False)
    datamodule, system = build_parts(cfg)
    system.set_save_dir(run_dir / "save")
    datamodule.val_scene()
    note(f"lego_nerf: data loaded in {time.perf_counter() - start:.1f}s: {len(datamodule.train)} train views "
         f"{datamodule.train.cameras.width}x{datamodule.train.cameras.height}")
    results: list[dict] = []
    trainer.callbacks.append(make_callback(datamodule, checkpoints, args.train_budget, args.eval_views, results, name))
    trainer.fit(system, datamodule=datamodule)
    system = system.to("cuda" if torch.cuda.is_available() else "cpu")
    return system, datamodule, results


def run(args, env: dict) -> int:
    from lift3d.config import load_config
    from lift3d.recipes import recipe_config

    checkpoints = [int(s) for s in args.steps.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="lift3d-bench-lego-nerf-"))
    overrides = [f"data.root={args.data}", f"data.rays_per_batch={args.rays}", f"trainer.max_steps={max(checkpoints)}",
                 "trainer.val_check_interval=0", "trainer.enable_progress_bar=false", "trainer.run_test_after_fit=false",
                 "checkpoint.every_n_train_steps=0", "checkpoint.save_last=false", f"output_root={workdir}",
                 "use_timestamp=false", *args.overrides]
    cfg = load_config(recipe_config("reconstruct-nerf"), overrides=overrides)
    start = time.perf_counter()
    references = [r for r in args.reference.split(",") if r and r != "none"]
    unknown = sorted(set(references) - {"plain", "eager"})
    if unknown:
        raise SystemExit(f"--reference: unknown {unknown}; choose from none, plain, eager (comma separated)")
    system, datamodule, results = train_recipe(cfg, workdir / "run_dir", checkpoints, args, "lego_nerf")
    for record in results:
        record.update(env)
        emit(record)
    if "eager" in references:  # the same recipe with every kernel launched from Python: what the CUDA graph buys
        eager_cfg = load_config(recipe_config("reconstruct-nerf"), overrides=[*overrides, "system.cuda_graphs=false"])
        _, _, eager = train_recipe(eager_cfg, workdir / "eager", checkpoints, args, "lego_nerf_eager")
        for record in eager:
            emit({**record, "reference": "the recipe with system.cuda_graphs=false",
                  "recipe_speed_vs_eager": speed_ratio(record, results), **env})
    for size, frames in ((64, 50), (512, 10)):
        emit({**throughput(system, datamodule, size, frames), **env})
    if not args.skip_profile:
        from lift3d.systems.optim import build_optimizer

        # Lightning's teardown may move optimizer state to the CPU: profile with a fresh optimizer of the same set-up
        optimizer = build_optimizer(system, system.cfg.optimizer, step=max(checkpoints))
        record, _ = profile_step(system, datamodule, optimizer)
        emit({**record, **env})
        per_ray = system.renderer._per_ray
        samples = record["samples_per_step"]
        emit({**floor_estimate(system, samples, per_ray.get("first", 0.0) * args.rays, args.rays), **env})
    if "plain" in references:
        from benchmarks.reference.plain_nerf import train_plain

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        plain = train_plain(cfg, datamodule, device, checkpoints, args.train_budget,
                            lambda trained: evaluate(trained, datamodule, args.eval_views), sync)
        for record in plain:
            emit({"name": f"lego_nerf_plain_{record['target_steps']}_steps", "reference": "plain loop (reference.plain_nerf)",
                  **record, "recipe_speed_vs_plain": speed_ratio(record, results), **env})
    best = [r for r in results if r["psnr"] >= 30.0]
    emit({"name": "lego_nerf_summary", "first_30dB_step": best[0]["steps"] if best else None,
          "first_30dB_train_wall_s": best[0]["train_wall_s"] if best else None,
          "final_psnr": results[-1]["psnr"] if results else None, "total_wall_s": round(time.perf_counter() - start, 1), **env})
    return 0


if __name__ == "__main__":
    sys.exit(main())

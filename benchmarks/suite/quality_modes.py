"""The Gaussian recipe's quality options side by side in one call: default, MCMC densification, the antialiased
rasterization mode and absgrad growing, each trained in its own process (a clean peak-memory count) on the same
scene and steps. Prints one JSON line per variant and step: PSNR, SSIM, training seconds, Gaussian count, peak GPU
memory; then one summary line. The defaults of ``reconstruct-gaussians`` are chosen from these figures.

    python -m benchmarks quality_modes                                  # lego (400x400), 7k and 30k steps
    python -m benchmarks quality_modes --steps 7000 --eval-at 7000 --variants default,mcmc
    python -m benchmarks quality_modes --capture ../shared/data/fox --steps 7000   # a real capture
    python -m benchmarks quality_modes --device cpu --steps 100 --eval-at 100 --val-views 4   # a CPU smoke run

MCMC gets a budget (``max_gaussians``) equal to the default run's final Gaussian count unless ``--mcmc-cap`` says otherwise,
so the two are compared at the same size, and gsplat's MCMC start (opacity 0.5, scales 0.1 x the neighbor distance).
Lego runs go through the ``lego_gaussians`` benchmark (with ``--reference plain``: the plain gsplat loop after the
default variant); captures through ``capture``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.records import json_lines

REPO = Path(__file__).resolve().parents[2]

VARIANTS: dict[str, list[str]] = {
    "default": [],
    "mcmc": ["system.densify_type=densify-mcmc", "system.gaussians.init_opacity=0.5", "system.gaussians.init_scale=0.1"],
    "antialiased": ["system.renderer.rasterize_mode=antialiased"],
    "absgrad": ["system.densify.absgrad=true"],
}


def run(name: str, args: list[str]) -> list[dict]:
    """Run the benchmark ``name`` in its own process; its JSON lines (stderr passes through)."""
    command = [sys.executable, "-m", "benchmarks", name, *args]
    print("+ " + " ".join(command), file=sys.stderr, flush=True)
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False, cwd=REPO)
    records = json_lines(done.stdout)
    if done.returncode != 0:
        records.append({"error": f"exit status {done.returncode}", "tail": done.stdout[-2000:]})
    return records


def lego_variant(args: argparse.Namespace, name: str, overrides: list[str]) -> tuple[list[dict], int]:
    """Per-step records of one variant on lego, and its final Gaussian count."""
    command = ["--device", args.device, "--steps", str(args.steps), "--eval-at", args.eval_at, "--val-views", str(args.val_views)]
    if args.data:
        command += ["--data", args.data]
    if args.reference and name == "default":
        command += ["--reference", "plain"]
    records = run("lego_gaussians", command + overrides + args.overrides)
    summary = next((r for r in records if r.get("summary")), {})
    memory = {k: summary[k] for k in ("peak_allocated_gib", "peak_reserved_gib") if k in summary}
    rows = [{"bench": "quality_modes", "variant": name, "step": r["step"], "psnr": r.get("val_psnr"),
             "ssim": r.get("val_ssim"), "train_seconds": r.get("train_seconds"), "gaussians": r.get("gaussians"), **memory}
            for r in summary.get("results", [])]
    for r in records:
        if r.get("reference"):
            rows.append({"bench": "quality_modes", "variant": "plain-gsplat", **{k: r[k] for k in r if k != "bench"}})
        if "error" in r:
            rows.append({"bench": "quality_modes", "variant": name, **r})
    counts = [row["gaussians"] for row in rows if row.get("gaussians")]
    return rows, int(counts[-1]) if counts else 0


def capture_variant(args: argparse.Namespace, name: str, overrides: list[str]) -> tuple[list[dict], int]:
    """The record of one variant on a capture (the ``capture`` benchmark), and its final Gaussian count."""
    command = [args.capture, "--steps", str(args.steps)]
    for item in overrides + args.overrides:
        command += ["--set", item]
    rows = []
    for r in run("capture", command):
        if "error" in r:
            rows.append({"bench": "quality_modes", "variant": name, **r})
            continue
        rows.append({"bench": "quality_modes", "variant": name, "scene": r.get("scene"), "step": r.get("steps"),
                     "psnr": r.get("val_psnr"), "ssim": r.get("val_ssim"), "train_seconds": r.get("train_s"),
                     "gaussians": r.get("gaussians"), "peak_allocated_gib": r.get("peak_mem_gib")})
    counts = [row["gaussians"] for row in rows if row.get("gaussians")]
    return rows, int(counts[-1]) if counts else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks quality_modes",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="default,mcmc,antialiased,absgrad", help=f"comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--capture", default="", help="a capture folder (the capture benchmark) instead of lego")
    parser.add_argument("--data", default="", help="the lego folder (default: the lego_gaussians benchmark's)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=30000)
    parser.add_argument("--eval-at", default="7000,30000", help="lego: steps at which to score the val views")
    parser.add_argument("--val-views", type=int, default=-1, help="lego: score this many val views (-1: all)")
    parser.add_argument("--mcmc-cap", type=int, default=0, help="MCMC's Gaussian budget (0: the default variant's final count)")
    parser.add_argument("--reference", action="store_true", help="lego: also the plain gsplat loop (after the default)")
    parser.add_argument("overrides", nargs="*", help="config overrides for every variant")
    args = parser.parse_args(argv)
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    if "mcmc" in names and not args.mcmc_cap and "default" in names:
        names = ["default"] + [n for n in names if n != "default"]  # the default's count sets MCMC's budget
    one = capture_variant if args.capture else lego_variant
    cap, summary = args.mcmc_cap, []
    for name in names:
        overrides = list(VARIANTS[name])
        if name == "mcmc":
            overrides.append(f"system.densify.max_gaussians={cap or 1_000_000}")
        rows, count = one(args, name, overrides)
        if name == "default" and not cap:
            cap = count
        for row in rows:
            print(json.dumps(row), flush=True)
        summary.extend(rows)
    print(json.dumps({"bench": "quality_modes", "summary": True, "mcmc_cap": cap, "steps": args.steps,
                      "scene": args.capture or "lego", "rows": summary}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

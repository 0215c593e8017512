"""CPU training beside other CPU-bound work: a plain `lift3d reconstruct SCENE` (the CPU default recipe) timed with no
extra load and with ``--load`` busy-loop processes that this script starts and stops itself; one JSON line.

Phases alternate (idle, loaded, loaded, idle, ...) in one training run, so the slower steps of a growing Gaussian
count weigh on both sides alike; steps/s come from the run's progress.json (step and time of each write). Each variant
is its own `lift3d reconstruct` process with extra environment variables: ``--variant spin=GOMP_SPINCOUNT=300000``
is GNU OpenMP's own default (threads spin at each barrier), which the CLI replaces with a passive wait.

    python -m benchmarks cpu_load                       # the fox, CPU default, 2 load processes
    python -m benchmarks cpu_load --variant spin=GOMP_SPINCOUNT=300000 --variant one=OMP_NUM_THREADS=1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOX = ROOT.parent / "shared" / "data" / "fox"  # the shared test data beside the checkout
# the thread settings a variant may set; a variant starts from an environment without any of them
THREAD_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                    "OPENBLAS_NUM_THREADS")
BUSY_LOOP = "while True:\n    pass\n"


def start_load(count: int) -> list[subprocess.Popen]:
    """``count`` CPU-bound processes (a Python busy loop each)."""
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]


def stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.kill()
    for process in processes:
        process.wait()


def read_progress(out: Path) -> tuple[int, float] | None:
    """(step, time written) of the run's newest progress.json under ``out``, or None before training starts."""
    for path in out.glob("**/progress.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if record.get("status") == "running" and "updated" in record:
            return int(record["step"]), float(record["updated"])
    return None


def wait_until(out: Path, process: subprocess.Popen, deadline: float, min_step: int = -1,
               after: float = 0.0) -> tuple[int, float]:
    """The first progress record at ``min_step`` or later written after ``after`` (wall time)."""
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"lift3d exited with {process.returncode} before the measurement ended")
        seen = read_progress(out)
        if seen is not None and seen[0] >= min_step and seen[1] >= after:
            return seen
        time.sleep(0.2)
    raise TimeoutError("no training progress in time")


def measure(scene: Path, env_extra: dict[str, str], args: argparse.Namespace) -> dict:
    """One `lift3d reconstruct` run: alternating idle / loaded phases, steps/s of each."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    env.update(env_extra)
    with tempfile.TemporaryDirectory(prefix="lift3d-bench-cpu-load-") as tmp:
        out = Path(tmp)
        command = [sys.executable, "-m", "lift3d", "reconstruct", str(scene), f"output_root={out}",
                   "trainer.enable_progress_bar=false", "trainer.run_test_after_fit=false", *args.set]
        started = time.time()
        log = open(out / "lift3d.log", "w")  # noqa: SIM115  (closed below, after the process ends)
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        load: list[subprocess.Popen] = []
        phases = []
        try:
            step0, _ = wait_until(out, process, started + args.start_timeout, min_step=args.warmup_steps)
            start_s = time.time() - started
            for index in range(2 * args.rounds):
                loaded = index % 4 in (1, 2)  # idle, loaded, loaded, idle: a steady drift in step cost cancels
                load = start_load(args.load) if loaded else []
                begin = wait_until(out, process, time.time() + 600, after=time.time() + args.settle_s)
                end = wait_until(out, process, time.time() + 600 + args.phase_s, after=begin[1] + args.phase_s)
                stop(load)
                load = []
                phases.append({"loaded": loaded, "steps": end[0] - begin[0], "seconds": round(end[1] - begin[1], 2),
                               "steps_per_s": round((end[0] - begin[0]) / max(end[1] - begin[1], 1e-9), 3),
                               "loadavg_1min": round(os.getloadavg()[0], 2)})
        except (RuntimeError, TimeoutError) as error:
            log.flush()
            tail = (out / "lift3d.log").read_text()[-1500:]
            return {"env": env_extra, "error": str(error), "log_tail": tail, "phases": phases}
        finally:
            stop(load)
            process.send_signal(signal.SIGKILL)
            process.wait()
            log.close()

    def rate(loaded: bool) -> float:
        chosen = [p for p in phases if p["loaded"] == loaded]
        return sum(p["steps"] for p in chosen) / max(sum(p["seconds"] for p in chosen), 1e-9)

    idle, busy = rate(False), rate(True)
    return {"env": env_extra, "start_s": round(start_s, 1), "first_step": step0, "idle_steps_per_s": round(idle, 3),
            "loaded_steps_per_s": round(busy, 3), "loaded_over_idle": round(busy / max(idle, 1e-9), 3), "phases": phases}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks cpu_load", description=__doc__.splitlines()[0])
    parser.add_argument("scene", nargs="?", default=str(FOX), help="what lift3d reconstruct trains on (default: the fox)")
    parser.add_argument("--load", type=int, default=2, help="CPU-bound processes started beside training in loaded phases")
    parser.add_argument("--phase-s", type=float, default=30.0, help="seconds measured in each phase")
    parser.add_argument("--settle-s", type=float, default=3.0, help="seconds left out at the start of each phase")
    parser.add_argument("--rounds", type=int, default=2, help="idle + loaded phase pairs")
    parser.add_argument("--warmup-steps", type=int, default=5, help="training steps before the first phase")
    parser.add_argument("--start-timeout", type=float, default=900.0, help="seconds allowed until training reaches the warm-up")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE[,KEY=VALUE]",
                        help="also run with these environment variables (the plain CLI default always runs first)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    args = parser.parse_args(argv)
    variants: dict[str, dict[str, str]] = {"default": {}}
    for text in args.variant:
        name, _, pairs = text.partition("=")
        variants[name] = dict(pair.split("=", 1) for pair in pairs.split(",") if pair)
    record = {"bench": "cpu_load", "scene": args.scene, "load_processes": args.load, "phase_s": args.phase_s,
              "cpus": os.cpu_count(), "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
              "machine": platform.platform(), "variants": {}}
    for name, env_extra in variants.items():
        record["variants"][name] = measure(Path(args.scene).expanduser().resolve(), env_extra, args)
        print(f"# {name}: {json.dumps(record['variants'][name])}", file=sys.stderr, flush=True)
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

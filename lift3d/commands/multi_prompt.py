"""Many prompts on many GPUs: ``lift3d generate --prompts prompts.txt`` shards a prompt list across the
visible GPUs, one asset per process, each GPU working through its share in turn.

One asset per process (``lift3d generate PROMPT --gpus 0`` with ``CUDA_VISIBLE_DEVICES`` set to that GPU)
keeps runs independent: a failing or out-of-memory prompt costs only itself, memory is returned between
assets, and throughput scales with the number of GPUs (no communication between them). Prompts go
round-robin (prompt i on GPU i mod n); a JSON summary records each prompt's GPU, status, seconds and
run folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def read_prompts(path: str | Path) -> list[str]:
    """Prompts of a text file, one per line; blank lines and lines starting with # are skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--prompts {path}: no such file (give a text file with one prompt per line)")
    prompts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    prompts = [p for p in prompts if p and not p.startswith("#")]
    if not prompts:
        raise ValueError(f"--prompts {path} has no prompts (one per line; # starts a comment)")
    return prompts


def shard(n_items: int, n_workers: int) -> list[list[int]]:
    """Item indices per worker, round-robin: worker w gets items w, w + n, w + 2n, ..."""
    if n_workers < 1:
        raise ValueError(f"need at least one worker, got {n_workers}")
    return [list(range(w, n_items, n_workers)) for w in range(n_workers)]


def worker_devices(gpus: Sequence[int] | None) -> list[str | None]:
    """The GPU of each worker: the given ids, else every visible GPU, else one CPU worker (None)."""
    if gpus:
        return [str(g) for g in gpus]
    try:
        import torch

        count = torch.cuda.device_count()
    except ImportError:  # pragma: no cover  (torch is a dependency)
        count = 0
    return [str(i) for i in range(count)] or [None]


def generate_command(prompt: str, method: str, overrides: Sequence[str], on_gpu: bool) -> list[str]:
    """The ``lift3d generate`` command of one asset (on the one GPU its process sees)."""
    gpus = ["--gpus", "0"] if on_gpu else []
    return [sys.executable, "-m", "lift3d", "generate", prompt, "--method", method, *gpus, *overrides]


def report_path(log_dir: Path, index: int) -> Path:
    """Where the ``index``-th asset's process writes its result (``lift3d generate --report``)."""
    return log_dir / f"{index:04d}.json"


def run_sharded(commands: Sequence[Sequence[str]], devices: Sequence[str | None], log_dir: Path) -> list[dict[str, Any]]:
    """Run ``commands`` (one asset each) sharded over ``devices``, one process per device at a time.

    Each process sees only its GPU (``CUDA_VISIBLE_DEVICES``); its output goes to ``log_dir/<index>.log``, its result
    to ``report_path(log_dir, index)``. Returns one record per command (in input order): device, return code, seconds,
    run folder, log."""
    log_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = [{} for _ in commands]

    def work(device: str | None, indices: list[int]) -> None:
        env = dict(os.environ)
        if device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
        for index in indices:
            log = log_dir / f"{index:04d}.log"
            started = time.perf_counter()
            with open(log, "w", encoding="utf-8") as stream:
                code = subprocess.run(list(commands[index]), stdout=stream, stderr=subprocess.STDOUT, env=env).returncode
            report = report_path(log_dir, index)
            run_dir = json.loads(report.read_text())["run_dir"] if code == 0 and report.is_file() else None
            results[index] = {"index": index, "device": device, "returncode": code,
                              "status": "finished" if code == 0 else "failed",
                              "seconds": round(time.perf_counter() - started, 1), "run_dir": run_dir, "log": str(log)}

    threads = [threading.Thread(target=work, args=(device, indices), daemon=True)
               for device, indices in zip(devices, shard(len(commands), len(devices))) if indices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def generate_many(prompts_file: str | Path, method: str, overrides: Sequence[str], gpus: Sequence[int] | None,
                  summary_path: str | Path | None = None) -> tuple[Path, list[dict[str, Any]]]:
    """Generate one asset per prompt of ``prompts_file`` across the GPUs; write and return the JSON summary."""
    prompts = read_prompts(prompts_file)
    devices = worker_devices(gpus)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    summary = Path(summary_path) if summary_path else Path(f"generate-{stamp}.json")
    log_dir = summary.with_suffix("").parent / f"{summary.stem}-logs"
    commands = [generate_command(p, method, overrides, devices[0] is not None, report_path(log_dir, i))
                for i, p in enumerate(prompts)]
    print(f"lift3d: {len(prompts)} prompts on {len(devices)} {'GPU' if devices[0] is not None else 'CPU'} worker(s)", flush=True)
    results = run_sharded(commands, devices, log_dir)
    for prompt, record in zip(prompts, results):
        record["prompt"] = prompt
        where = record["device"] or "cpu"
        print(f"  [{record['status']}] {prompt!r} on {where} in {record['seconds']}s -> {record['run_dir']}")
    summary.parent.mkdir(parents=True, exist_ok=True)
    record = {"method": method, "overrides": list(overrides), "devices": devices, "results": results}
    summary.write_text(json.dumps(record, indent=1))
    print(f"lift3d: summary in {summary}")
    return summary, results


# ---------------------------------------------------------------------------------------------- CLI glue
PROMPTS_HELP = ("a text file with one prompt per line (# comments): one asset per prompt, sharded across the GPUs "
                "(--gpus, else every visible GPU); writes generate-<time>.json with each prompt's run folder")


def run_prompt_list(args: Any) -> int:
    """``lift3d generate --prompts FILE [--method M] [--gpus IDS] [overrides]`` (args as parsed by generate's parser:
    ``prompt`` optional, ``config`` the overrides, ``method``, ``gpus``, ``prompts``). 0 when every asset finished."""
    from lift3d.api.overrides import gpu_ids

    overrides = list(args.config)
    if args.prompt:  # argparse gives the first override to the optional positional prompt
        if "=" not in args.prompt:
            raise ValueError(f"give either a prompt or --prompts FILE, not both (got the prompt {args.prompt!r})")
        overrides.insert(0, args.prompt)
    _, results = generate_many(args.prompts, args.method or "gaussian-sds", overrides, gpu_ids(args.gpus))
    return 0 if all(r["returncode"] == 0 for r in results) else 1

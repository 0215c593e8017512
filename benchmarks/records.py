"""What benchmarks print and read: one JSON line per case, the environment every record carries, and the records of
a case that was skipped or unknown."""

from __future__ import annotations

import importlib.metadata
import json
import platform
from collections.abc import Iterable
from typing import Any

import torch


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects printed one per line in ``text`` (lines that are not JSON objects are skipped)."""
    records = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def emit(record: dict[str, Any]) -> None:
    """One JSON line to stdout, flushed (a caller reading the pipe sees each case as it ends)."""
    print(json.dumps(record, default=str), flush=True)


def version(name: str) -> str:
    """The installed version of the distribution ``name``, or "not installed"."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment(device: torch.device) -> dict[str, Any]:
    """Where a record was measured: package versions, the device and, on CUDA, its GPU."""
    info = {"torch": torch.__version__, "diffusers": version("diffusers"), "gsplat": version("gsplat"),
            "lift3d": version("lift3d"), "python": platform.python_version(), "device": str(device)}
    if device.type == "cuda":
        info.update(gpu=torch.cuda.get_device_name(device), gpus_visible=torch.cuda.device_count(), cuda=torch.version.cuda)
    return info


def device_name(device: torch.device | str) -> str:
    """The GPU's name on CUDA, else the CPU's (what a record's ``device`` field says)."""
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"


def unknown_case(bench: str, name: str, known: Iterable[str]) -> dict[str, Any]:
    """The error record of a case name the benchmark does not have."""
    return {"bench": bench, "case": name, "error": f"unknown case; known: {', '.join(known)}"}


def over_budget(bench: str, name: str, cost_s: float, elapsed_s: float, budget_s: float) -> dict[str, Any] | None:
    """The record of a case skipped because its rough cost would take the run past ``budget_s``; None when it fits."""
    if elapsed_s + cost_s <= budget_s:
        return None
    return {"bench": bench, "case": name, "skipped": f"time budget ({elapsed_s:.0f}s used, ~{cost_s:.0f}s needed)"}

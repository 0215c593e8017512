"""Where a training run's processes come from: the devices of one machine (``--gpus``), several machines (``--nodes``,
or torchrun's environment), and the one line each process says when it joins.

lift3d starts no processes itself: Lightning starts one per device of its machine (re-running the command), torchrun
starts them on each machine it runs on (``TORCHELASTIC_RUN_ID``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``RANK``), SLURM's
srun starts one per task. Under torchrun its environment decides the layout, whatever the config says."""

from __future__ import annotations

import dataclasses
import os
import socket
from typing import Any

from lift3d.config import ConfigError


def launched_by_torchrun() -> bool:
    """Whether this process was started by torchrun (``python -m torch.distributed.run``)."""
    return "TORCHELASTIC_RUN_ID" in os.environ and os.environ.get("WORLD_SIZE", "").isdigit()


def device_count(devices: Any, accelerator: str = "auto") -> int:
    """The processes ``trainer.devices`` starts on one machine (a list of GPU ids, a count, -1 or auto: every GPU)."""
    if isinstance(devices, (list, tuple)):
        return max(len(devices), 1)
    if isinstance(devices, str) and devices.lstrip("-").isdigit():
        devices = int(devices)
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        return devices
    if str(accelerator).lower() == "cpu":
        return 1
    import torch

    return max(torch.cuda.device_count(), 1)


def launch_layout(trainer: Any, devices: Any = None) -> tuple[Any, int]:
    """(devices, num_nodes) to hand Lightning: torchrun's layout when it started this process (one process per
    device it started on each machine), else ``devices`` (the caller's) or ``trainer.devices``, and
    ``trainer.num_nodes``."""
    if devices is not None:  # the caller's own (an evaluation trainer's 1, a benchmark's GPU ids): this machine's
        return devices, trainer.num_nodes if device_count(devices, trainer.accelerator) > 1 else 1
    devices = trainer.devices
    if not launched_by_torchrun():
        return devices, trainer.num_nodes
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world % local:
        raise ConfigError(f"torchrun started {world} processes in all but {local} on this machine: start the same "
                          "--nproc-per-node on every machine")
    nodes = world // local
    if trainer.num_nodes not in (1, nodes):
        raise ConfigError(f"--nodes {trainer.num_nodes} (trainer.num_nodes) but torchrun runs {nodes} machine(s): drop "
                          "--nodes under torchrun (its --nnodes decides)")
    return local, nodes


def training_processes(trainer: Any, devices: Any = None) -> int:
    """How many processes train: torchrun's (or a rank Lightning started: its WORLD_SIZE), else the devices times
    ``trainer.num_nodes``."""
    launched = "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ
    if devices is None and launched and os.environ.get("WORLD_SIZE", "").isdigit():
        return int(os.environ["WORLD_SIZE"])
    layout, nodes = launch_layout(trainer, devices)
    return device_count(layout, trainer.accelerator) * nodes


def rank_line(global_rank: int, world_size: int, local_rank: int, node_rank: int, device: Any) -> str:
    """What each process of a several-process run says once when training starts (so a user sees every rank join)."""
    return (f"rank {global_rank} of {world_size} on {socket.gethostname()} (node {node_rank}, local rank {local_rank}), "
            f"{device}")


def data_defaults(data_type: str) -> dict[str, Any]:
    """The default of every key of the data module registered as ``data_type`` (empty when it is unknown)."""
    from lift3d.registry import find

    try:
        schema = getattr(find(str(data_type)), "Config", None)
    except Exception:  # noqa: BLE001  (an unknown part is the config check's to report)
        return {}
    if schema is None or not dataclasses.is_dataclass(schema):
        return {}
    return {f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            for f in dataclasses.fields(schema)}


def views_per_step(data: dict, data_type: str) -> int:
    """Views (rays, in a rays-mode data module) one process takes a step: the first of a list of batch sizes."""
    defaults = data_defaults(data_type)
    key = "rays_per_batch" if data.get("batch_mode", defaults.get("batch_mode")) == "rays" else "batch_size"
    value = data.get(key, defaults.get(key, 1))
    value = value[0] if isinstance(value, (list, tuple)) and value else value
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else 1


def training_layout(data: dict, data_type: str) -> tuple[int, int, int]:
    """(views a step on one process, width, height) as the data config says (0 x 0: the photos' own size); lists of
    sizes (a resolution schedule) count their largest."""
    defaults = data_defaults(data_type)

    def largest(key: str) -> int:
        value = data.get(key, defaults.get(key, 0))
        values = value if isinstance(value, (list, tuple)) else [value]
        return max([int(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)] or [0])

    views = largest("batch_size") if data.get("batch_mode", defaults.get("batch_mode")) != "rays" else 1
    return max(views, 1), largest("width"), largest("height")

"""Checks of an experiment's ``trainer``, ``checkpoint`` and ``viewer`` values before Lightning sees them.

Lightning refuses bad values itself, but late (after the run folder is made) and in its own words (a negative
``max_steps``, ``--gpus`` on a machine without CUDA, an unknown strategy): these checks say which lift3d key or
flag is wrong and what to set instead, as a ``ConfigError`` (one line, exit code 2)."""

from __future__ import annotations

from typing import Any

from lift3d.config import ConfigError


def _wants_gpu(accelerator: str, devices: Any) -> bool:
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and isinstance(devices, (list, tuple)) and bool(devices))


def check_devices(accelerator: str, devices: Any) -> None:
    """The accelerator and devices, against what this machine has (a GPU asked for where torch sees none)."""
    import torch

    accelerator = str(accelerator).lower()  # one of TrainerConfig's choices (declared there)
    if isinstance(devices, str) and devices.lstrip("-").isdigit():
        devices = int(devices)
    if isinstance(devices, (list, tuple)):
        if not devices or any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in devices):
            raise ConfigError(f"trainer.devices must list GPU ids >= 0, got {list(devices)}: e.g. --gpus 0 or --gpus 0,1")
    elif isinstance(devices, int) and not isinstance(devices, bool):
        if devices == 0 or devices < -1:
            raise ConfigError(f"trainer.devices must be a number of devices >= 1 (or -1: all), got {devices}: "
                              "e.g. trainer.devices=1")
    elif devices != "auto":
        raise ConfigError(f"trainer.devices must be a count, a list of GPU ids or auto, got {devices!r}: e.g. trainer.devices=1")
    if _wants_gpu(accelerator, devices):
        if not torch.cuda.is_available():
            cuda = torch.version.cuda or "none (a CPU-only torch)"
            raise ConfigError(f"--gpus / trainer.accelerator={accelerator} asks for a CUDA GPU, but torch sees none here "
                              f"(torch {torch.__version__}, its CUDA build: {cuda}): drop --gpus (or set "
                              "trainer.accelerator=cpu) to run on the CPU")
        count = torch.cuda.device_count()
        missing = [d for d in devices if d >= count] if isinstance(devices, (list, tuple)) else []
        if missing:
            raise ConfigError(f"--gpus names GPU {', '.join(map(str, missing))}, but this machine has {count} "
                              f"(ids 0..{count - 1}): e.g. --gpus {','.join(map(str, range(min(count, 2))))}")
    if accelerator == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ConfigError("trainer.accelerator=mps needs an Apple GPU, which torch does not see here: use "
                          "trainer.accelerator=auto")


def check_strategy(strategy: Any) -> None:
    if not isinstance(strategy, str) or strategy == "auto":
        return
    from lightning.pytorch.strategies import StrategyRegistry

    known = StrategyRegistry.available_strategies()
    if strategy not in known:
        ddp = ", ".join(s for s in known if s.startswith("ddp") and "_find_unused" not in s)
        raise ConfigError(f"trainer.strategy '{strategy}' is not a Lightning strategy: use auto (lift3d picks DDP for "
                          f"several GPUs) or one of {ddp}")


def check_trainer(cfg: Any) -> None:
    """Refuse ``cfg.trainer`` / ``cfg.viewer`` values Lightning or lift3d cannot run on this machine, with the fix (the
    choices and bounds of each key are declared on its field and checked when the config loads)."""
    t = cfg.trainer
    limit = t.limit_val_batches
    if isinstance(limit, float) and limit > 1.0:
        raise ConfigError(f"trainer.limit_val_batches must be a fraction 0..1 or a whole number of views, got {limit}: "
                          "e.g. trainer.limit_val_batches=1.0")
    check_devices(t.accelerator, t.devices)
    check_strategy(t.strategy)
    check_viewer(cfg.viewer)


def check_port(what: str, port: int, example: str) -> None:
    """A TCP port: 0 (any free one) to 65535; ``what`` names the flag or key, ``example`` a good setting of it."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"{what} must be a TCP port 0..65535 (0: any free one), got {port}: e.g. {example}")


def check_listen(host: str, port: int, flag: str = "--host") -> None:
    """Fail fast where viser could not listen: it tries ``port`` and the next 999 ports on a background thread and,
    when none binds (a host that is not this machine's, a name that does not resolve, a port out of range), its
    caller waits forever. A port in use is fine (viser takes the next free one). ``flag`` names the option to change."""
    import socket

    check_port("the viewer's port", port, "--port 8080")
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError) as error:
        raise ConfigError(f"the viewer cannot listen on {host}: the name does not resolve ({error}); use {flag} 127.0.0.1 "
                          f"(this machine only) or {flag} 0.0.0.0 (every interface)") from None
    failures = []
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as probe:
            try:
                probe.bind((address[0], 0, *address[2:]))  # any free port: only whether the address is this machine's
                return
            except OSError as error:
                failures.append(error.strerror or str(error))
    raise ConfigError(f"the viewer cannot listen on {host}: {'; '.join(sorted(set(failures)))} (not an address of this "
                      f"machine); use {flag} 127.0.0.1 (this machine only) or {flag} 0.0.0.0 (every interface)")


def check_viewer(v: Any) -> None:
    if not v.enabled:
        return
    # before training: a host that is not this machine's fails now, not at the first step
    check_listen(v.host, v.port, "--viewer-host")

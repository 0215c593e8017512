"""The once-per-device check guarding each Triton fast path: before a kernel replaces PyTorch ops on a GPU, it is
compared with them there once; a failure is logged and the PyTorch ops are used for the rest of the process."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger("lift3d")


def checked_once(results: dict[torch.device, bool], device: torch.device, compare: Callable[[torch.device], None],
                 what: str, fallback: str) -> bool:
    """Whether ``compare(device)`` passed (raised nothing), run once per CUDA device and remembered in ``results``,
    with autocast off; never inside a CUDA graph capture (the check waits on the GPU): there it answers False until
    checked."""
    if device.type != "cuda":
        return False
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in results:
        if torch.cuda.is_current_stream_capturing():
            return False
        try:
            # the first use may come from inside autocast (a 16-mixed run's validation SSIM): the PyTorch reference
            # would then run in half precision and the check fail for the rest of the process
            with torch.inference_mode(False), torch.no_grad(), torch.autocast("cuda", enabled=False):
                compare(device)
            results[device] = True
        except Exception as error:  # noqa: BLE001 - any failure means: use the PyTorch ops
            log.warning("%s unavailable (%s); using %s", what, error, fallback)
            results[device] = False
    return results[device]

"""The once-per-device check of a Triton fast path: remembered, never in a capture, run with autocast off."""

import pytest
import torch

from lift3d.triton_checks import checked_once


def test_the_check_runs_once_with_autocast_off_even_when_first_asked_inside_autocast(monkeypatch):
    """A 16-mixed run's validation may be the first to ask (the SSIM blur): the reference must not then run in half
    precision, which made the blur's check fail for the rest of the process on an H100."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    seen = []

    def compare(device):
        seen.append((device, torch.is_autocast_enabled("cuda"), torch.is_grad_enabled()))

    results = {}
    torch.set_autocast_enabled("cuda", True)  # what torch.autocast("cuda") sets (which a CPU-only build refuses)
    try:
        assert checked_once(results, torch.device("cuda", 0), compare, "a kernel", "the PyTorch ops")
        assert torch.is_autocast_enabled("cuda")  # restored
    finally:
        torch.set_autocast_enabled("cuda", False)
    assert checked_once(results, torch.device("cuda", 0), compare, "a kernel", "the PyTorch ops")
    assert seen == [(torch.device("cuda", 0), False, False)]


def test_a_failed_check_is_remembered_and_a_capture_never_checks(monkeypatch):
    capturing = [True]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    calls = []

    def compare(device):
        calls.append(device)
        raise RuntimeError("differs")

    results = {}
    assert not checked_once(results, torch.device("cuda", 1), compare, "a kernel", "the PyTorch ops")
    assert calls == [] and results == {}
    capturing[0] = False
    assert not checked_once(results, torch.device("cuda", 1), compare, "a kernel", "the PyTorch ops")
    assert not checked_once(results, torch.device("cuda", 1), compare, "a kernel", "the PyTorch ops")
    assert len(calls) == 1 and results == {torch.device("cuda", 1): False}
    assert not checked_once(results, torch.device("cpu"), compare, "a kernel", "the PyTorch ops")


@pytest.mark.gpu
def test_the_ssim_blur_passes_its_check_when_first_asked_under_autocast_on_cuda():
    from lift3d.metrics import ssim_triton as metrics_triton

    device = torch.device("cuda", torch.cuda.current_device())
    with torch.autocast("cuda", dtype=torch.float16):
        assert checked_once({}, device, metrics_triton._compare, "Triton blur for SSIM", "the convolution")

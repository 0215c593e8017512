"""Placement: the device a ``.to(...)`` call names, read from its public arguments."""

from __future__ import annotations

import torch

from lift3d.guidance.placement import runtime_dtype, target_device


def test_target_device_reads_every_form_of_to():
    cpu = torch.device("cpu")
    assert target_device("cpu") == cpu
    assert target_device(cpu, torch.float16) == cpu
    assert target_device(device="cpu", dtype=torch.float16) == cpu
    assert target_device(torch.zeros(1)) == cpu
    assert target_device("cuda:1") == torch.device("cuda", 1)
    assert target_device(torch.float16) is None
    assert target_device(torch.float16, True) is None  # non_blocking is no device
    assert target_device(memory_format=torch.channels_last) is None


def test_runtime_dtype_falls_back_to_fp32_off_cuda_only_for_auto():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert runtime_dtype(torch.float16, "auto", cpu) == torch.float32
    assert runtime_dtype(torch.float16, "auto", cuda) == torch.float16
    assert runtime_dtype(torch.float16, "fp16", cpu) == torch.float16

"""Budgeted compaction by the Triton kernel equals the PyTorch ops (interpreter on the CPU, and on CUDA)."""

import textwrap

import pytest
import torch

from lift3d.render.sampling import compact
from tests.conftest import run_in_triton_interpreter

COMPACT_CHECK = textwrap.dedent(
    """
    import torch
    from lift3d.render.compact_triton import BLOCK
    from lift3d.render.sampling import compact
    torch.manual_seed(0)
    for n, rate in ((BLOCK * 2 + 77, 0.3), (500, 0.0), (500, 1.0), (0, 0.5)):
        mask = torch.rand(n) < rate
        count = int(mask.sum())
        for budget in sorted({1, max(count // 2, 1), max(count, 1), count + 37}):
            fast, slow = compact(mask, budget, fused=True), compact(mask, budget, fused=False)
            assert torch.equal(fast.index, slow.index), (n, rate, budget)
            assert torch.equal(fast.valid, slow.valid) and torch.equal(fast.dropped, slow.dropped)
    print("ok")
    """
)


def test_the_triton_compaction_equals_the_pytorch_ops_in_the_interpreter():
    run_in_triton_interpreter(COMPACT_CHECK, "the Triton compaction")


def test_budgeted_compaction_by_hand():
    mask = torch.tensor([False, True, True, False, True, True])
    packed = compact(mask, 3)
    assert packed.index.tolist() == [1, 2, 4] and packed.valid.all()
    assert packed.dropped.tolist() == [False, False, False, False, False, True]
    padded = compact(mask, 6)
    assert padded.index.tolist() == [1, 2, 4, 5, 5, 5] and padded.valid.tolist() == [True] * 4 + [False] * 2


@pytest.mark.gpu
def test_the_triton_compaction_is_checked_and_used_on_cuda(monkeypatch):
    import lift3d.render.compact_triton as kernel

    calls = []
    real = kernel.place
    monkeypatch.setattr(kernel, "place", lambda m, b: calls.append(1) or real(m, b))
    mask = torch.rand(20_000_000, device="cuda") < 0.4
    budget = int(mask.sum()) - 1000
    fast, slow = compact(mask, budget), compact(mask, budget, fused=False)
    assert calls and torch.equal(fast.index, slow.index) and torch.equal(fast.valid, slow.valid)
    assert torch.equal(fast.dropped, slow.dropped) and int(fast.dropped.sum()) == 1000

"""The renderer's packing kernels (budgeted compaction, row gather) equal the PyTorch ops (interpreter on the CPU,
and on CUDA)."""

import textwrap

import pytest
import torch

from lift3d.render.volume.pack_triton import take_rows
from lift3d.render.volume.sampling import compact
from tests.conftest import run_in_triton_interpreter

GATHER_CHECK = textwrap.dedent(
    """
    import torch
    from lift3d.render.volume.pack_triton import ROWS, take_rows_triton
    torch.manual_seed(0)
    for dtype, columns in ((torch.float16, 32), (torch.float32, 8), (torch.int64, 1)):
        source = (torch.randn(300, columns) * 100).to(dtype)
        for index in (torch.randint(0, 300, (ROWS * 2 + 37,)), torch.arange(299, -1, -3), torch.zeros(0, dtype=torch.long)):
            taken = take_rows_triton(source, index)
            assert taken.dtype == dtype and torch.equal(taken, torch.index_select(source, 0, index))
    print("ok")
    """
)


def test_the_triton_row_gather_equals_index_select_in_the_interpreter():
    run_in_triton_interpreter(GATHER_CHECK, "the Triton row gather")


def test_take_rows_is_index_select_where_the_kernel_does_not_apply():
    source = torch.randn(50, 3)  # on the CPU, and a width that is not a power of two
    index = torch.tensor([4, 4, 0, 49])
    torch.testing.assert_close(take_rows(source, index), source[index], atol=0, rtol=0)


@pytest.mark.gpu
def test_the_triton_row_gather_is_checked_and_used_on_cuda(monkeypatch):
    import lift3d.render.volume.pack_triton as pack

    calls = []
    real = pack.take_rows_triton
    monkeypatch.setattr(pack, "take_rows_triton", lambda s, i: calls.append(1) or real(s, i))
    source = torch.randn(3_000_000, 32, device="cuda").half()
    index = torch.sort(torch.randint(0, 3_000_000, (2_000_000,), device="cuda")).values
    assert torch.equal(take_rows(source, index), source[index])
    assert pack._GATHER_CHECKED[torch.device("cuda", torch.cuda.current_device())] and calls


COMPACT_CHECK = textwrap.dedent(
    """
    import torch
    from lift3d.render.volume.pack_triton import BLOCK
    from lift3d.render.volume.sampling import compact
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
    import lift3d.render.volume.pack_triton as kernel

    calls = []
    real = kernel.place
    monkeypatch.setattr(kernel, "place", lambda m, b: calls.append(1) or real(m, b))
    mask = torch.rand(20_000_000, device="cuda") < 0.4
    budget = int(mask.sum()) - 1000
    fast, slow = compact(mask, budget), compact(mask, budget, fused=False)
    assert calls and torch.equal(fast.index, slow.index) and torch.equal(fast.valid, slow.valid)
    assert torch.equal(fast.dropped, slow.dropped) and int(fast.dropped.sum()) == 1000

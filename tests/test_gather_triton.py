"""The renderer's row gather: the Triton kernel equals index_select (interpreter on the CPU, and on CUDA)."""

import textwrap

import pytest
import torch

from lift3d.render.gather_triton import take_rows
from tests.conftest import run_in_triton_interpreter

GATHER_CHECK = textwrap.dedent(
    """
    import torch
    from lift3d.render.gather_triton import ROWS, take_rows_triton
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
    import lift3d.render.gather_triton as gather

    calls = []
    real = gather.take_rows_triton
    monkeypatch.setattr(gather, "take_rows_triton", lambda s, i: calls.append(1) or real(s, i))
    source = torch.randn(3_000_000, 32, device="cuda").half()
    index = torch.sort(torch.randint(0, 3_000_000, (2_000_000,), device="cuda")).values
    assert torch.equal(take_rows(source, index), source[index])
    assert gather._CHECKED[torch.device("cuda", torch.cuda.current_device())] and calls

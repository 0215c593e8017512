"""Visible-only Adam (lift3d.systems.visible_adam): Adam on the seen Gaussians, nothing on the others."""

import torch

from lift3d.systems.visible_adam import supports, visibility, visible_adam_step
from tests.conftest import run_in_triton_interpreter


def _pair(seed: int = 0) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    """Two copies of Gaussian-shaped parameters (7 Gaussians) and a per-photo one (3 photos)."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(7, 3), (7,), (7, 15, 3), (3, 4)]
    values = [torch.randn(s, generator=generator) for s in shapes]
    return ([torch.nn.Parameter(v.clone()) for v in values], [torch.nn.Parameter(v.clone()) for v in values])


def _grads(params: list[torch.nn.Parameter], seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=generator) for p in params]


def test_visible_adam_equals_adam_on_visible_rows_and_leaves_the_others_untouched():
    ours, theirs = _pair()
    options = {"lr": 0.01, "betas": (0.9, 0.99), "eps": 1e-8}
    mine = torch.optim.Adam([{"params": ours[:2], "lr": 0.02}, {"params": ours[2:]}], **options)
    adam = torch.optim.Adam([{"params": theirs[:2], "lr": 0.02}, {"params": theirs[2:]}], **options)
    assert supports(mine)
    visible = torch.tensor([True, False, True, True, False, True, False])
    for step in range(4):
        grads = _grads(ours, step)
        for params in (ours, theirs):
            for p, g in zip(params, grads):
                p.grad = g.clone()
        if step == 0:  # the first step eager Adam (as the recipe's first step): state as torch keeps it
            mine.step()
        else:
            before = [(p.detach().clone(), {k: v.clone() for k, v in mine.state[p].items()}) for p in ours]
            visible_adam_step(mine, visible, use_triton=False)
            for p, (value, state) in zip(ours[:3], before[:3]):  # Gaussian rows outside the view: nothing changed
                assert torch.equal(p.detach()[~visible], value[~visible])
                assert torch.equal(mine.state[p]["exp_avg"][~visible], state["exp_avg"][~visible])
                assert torch.equal(mine.state[p]["exp_avg_sq"][~visible], state["exp_avg_sq"][~visible])
            for p in ours[:3]:  # the invisible rows of the reference copy: follow them
                p.grad[~visible] = 0
        adam.step()
        if step > 0:  # the reference moves invisible rows by momentum: copy ours there so visible rows stay comparable
            for p, q in zip(ours[:3], theirs[:3]):
                with torch.no_grad():
                    q[~visible] = p[~visible]
                for key in ("exp_avg", "exp_avg_sq"):
                    adam.state[q][key][~visible] = mine.state[p][key][~visible]
        for p, q in zip(ours, theirs):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)
            assert float(mine.state[p]["step"]) == float(adam.state[q]["step"]) == step + 1
    # the per-photo parameter (3 rows, not the Gaussian count) took plain Adam's step every time
    torch.testing.assert_close(ours[3].detach(), theirs[3].detach(), rtol=1e-5, atol=1e-6)


def test_all_visible_is_plain_adam_with_a_scheduled_tensor_learning_rate_and_weight_decay():
    ours, theirs = _pair(1)
    mine = torch.optim.Adam(ours, lr=0.05, eps=1e-15, weight_decay=0.01)  # decay: as the pose corrections' group
    adam = torch.optim.Adam(theirs, lr=0.05, eps=1e-15, weight_decay=0.01)
    for step in range(3):
        for params in (ours, theirs):
            for p, g in zip(params, _grads(params, 10 + step)):
                p.grad = g
        if step == 0:
            mine.step()
            mine.param_groups[0]["lr"] = torch.tensor(0.05)
        else:
            visible_adam_step(mine, torch.ones(7, dtype=torch.bool), use_triton=False)
        adam.step()
    for p, q in zip(ours, theirs):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6)


def test_visibility_of_a_render_and_what_is_supported():
    radii = torch.tensor([[[3, 2], [0, 0], [4, 0]], [[0, 0], [0, 0], [1, 1]]])
    assert visibility(radii).tolist() == [True, False, True]
    assert visibility(radii[..., 0]).tolist() == [True, False, True]
    p = [torch.nn.Parameter(torch.zeros(2))]
    assert supports(torch.optim.Adam(p, weight_decay=0.1)) and supports(torch.optim.AdamW(p, weight_decay=0.0))
    assert not supports(torch.optim.AdamW(p, weight_decay=0.1))  # decoupled decay: not this update
    assert not supports(torch.optim.Adam(p, amsgrad=True))
    assert not supports(torch.optim.SGD(p, lr=0.1))


VISIBLE_ADAM_CHECK = """
import torch
from lift3d.systems.visible_adam import visible_adam_step
torch.manual_seed(0)
for shape in [(37, 3), (37,), (37, 15, 3), (5, 4)]:
    fast = torch.nn.Parameter(torch.randn(shape))
    slow = torch.nn.Parameter(fast.detach().clone())
    opts = [torch.optim.Adam([p], lr=0.01, eps=1e-15, weight_decay=0.05) for p in (fast, slow)]
    visible = torch.rand(37) > 0.4
    for step in range(3):
        grad = torch.randn(shape)
        for p, o in zip((fast, slow), opts):
            p.grad = grad.clone()
            if step == 0:
                o.step()
                o.param_groups[0]["lr"] = torch.tensor(0.01)
        if step:
            visible_adam_step(opts[0], visible, use_triton=True)
            visible_adam_step(opts[1], visible, use_triton=False)
    torch.testing.assert_close(fast.detach(), slow.detach(), rtol=1e-5, atol=1e-6)
    for key in ("exp_avg", "exp_avg_sq", "step"):
        torch.testing.assert_close(opts[0].state[fast][key], opts[1].state[slow][key], rtol=1e-5, atol=1e-7)
print("ok")
"""


def test_the_triton_update_equals_the_reference_in_the_interpreter():
    """The CUDA fast path (one Triton kernel a parameter, unseen rows not read) run by Triton's interpreter."""
    run_in_triton_interpreter(VISIBLE_ADAM_CHECK, "the visible-Adam kernel")

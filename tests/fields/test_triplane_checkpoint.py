"""The triplane field recomputes its decoder in the backward pass while training (checkpoint_decoder): the same
density, features and gradients as keeping the activations, and fewer tensors kept for the backward pass."""

import torch

from lift3d.fields.triplane import TriplaneField


def _field(checkpointed: bool) -> TriplaneField:
    torch.manual_seed(0)
    field = TriplaneField({"plane_channels": 8, "plane_size": 16, "n_neurons": 16, "n_hidden_layers": 4,
                           "checkpoint_decoder": checkpointed})
    with torch.no_grad():
        field.triplane.normal_()
    return field


def _saved_tensors(field: TriplaneField, points: torch.Tensor) -> int:
    count = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        field(points)
    return count


def test_checkpointed_decoder_gives_the_same_values_and_gradients_and_keeps_less():
    points = torch.rand(500, 3) * 1.6 - 0.8
    results = []
    for checkpointed in (False, True):
        field = _field(checkpointed)
        out = field(points)
        (out["density"].sum() + out["features"].square().sum()).backward()
        results.append((out["density"].detach(), out["features"].detach(), field.triplane.grad.clone(),
                        [p.grad.clone() for p in field.decoder.parameters()]))
    (d0, f0, t0, w0), (d1, f1, t1, w1) = results
    assert torch.allclose(d0, d1) and torch.allclose(f0, f1)
    assert torch.allclose(t0, t1, atol=1e-6) and all(torch.allclose(a, b, atol=1e-6) for a, b in zip(w0, w1))
    assert _saved_tensors(_field(True), points) < _saved_tensors(_field(False), points) / 2
    with torch.no_grad():  # queries without gradients (export, occupancy) take the plain path
        assert torch.equal(_field(True).density(points), _field(False).density(points))

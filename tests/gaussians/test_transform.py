"""Rotating Gaussians for the file formats' axes: means, covariances and view-dependent color all turn together."""

import math

import pytest
import torch

from lift3d.gaussians.transform import FLIP_YZ, rotate_gaussians
from lift3d.rotations import Z_UP_TO_Y_UP, matrix_to_quaternion, quaternion_to_matrix
from lift3d.sh import eval_sh, sh_rotation
from tests.gaussian_params import covariances, random_params


def random_rotation(seed: int) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    return q if torch.linalg.det(q) > 0 else -q


ROTATIONS = {"z-up to y-up": torch.tensor(Z_UP_TO_Y_UP, dtype=torch.float64),
             "flip y z": torch.tensor(FLIP_YZ, dtype=torch.float64),
             "half turn about z": torch.diag(torch.tensor([-1.0, -1.0, 1.0], dtype=torch.float64)),
             "random": random_rotation(3)}


@pytest.mark.parametrize("name", list(ROTATIONS))
def test_matrix_to_quaternion_gives_the_matrix_back(name):
    matrix = ROTATIONS[name]
    q = matrix_to_quaternion(matrix)
    assert math.isclose(float(q.norm()), 1.0, abs_tol=1e-12)
    assert torch.allclose(quaternion_to_matrix(q[None])[0], matrix, atol=1e-12)


@pytest.mark.parametrize("name", list(ROTATIONS))
def test_rotated_gaussians_look_like_the_originals_turned(name):
    matrix = ROTATIONS[name]
    params = {k: v.double() for k, v in random_params(50, degree=3, seed=1).items()}
    turned = rotate_gaussians(params, matrix)
    assert torch.allclose(turned["means"], params["means"] @ matrix.T, atol=1e-12)
    assert torch.equal(turned["log_scales"], params["log_scales"])
    assert torch.equal(turned["opacity_logits"], params["opacity_logits"])
    expected = matrix @ covariances(params["log_scales"], params["quats"]) @ matrix.T
    assert torch.allclose(covariances(turned["log_scales"], turned["quats"]), expected, atol=1e-12)
    # the color seen along d after the turn is the color seen along R^T d before it, every band included
    dirs = torch.randn(50, 3, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    before = eval_sh(3, torch.cat([params["sh0"], params["shN"]], 1), dirs @ matrix)  # rows: R^T d
    after = eval_sh(3, torch.cat([turned["sh0"], turned["shN"]], 1), dirs)
    assert torch.allclose(after, before, atol=1e-10)


def test_a_half_turn_only_changes_sh_signs():
    x = sh_rotation(torch.tensor(FLIP_YZ, dtype=torch.float64), 3)
    assert torch.allclose(x, torch.diag(torch.diagonal(x)), atol=1e-12)
    assert torch.allclose(torch.diagonal(x).abs(), torch.ones(16, dtype=torch.float64), atol=1e-12)


def test_a_reflection_is_refused():
    with pytest.raises(ValueError, match="proper rotation"):
        rotate_gaussians(random_params(3, degree=1), torch.diag(torch.tensor([1.0, 1.0, -1.0])))


def test_sh_rotation_of_half_turns_is_exact_and_the_same_every_call():
    """A half turn about an axis (the .spz and glTF axis conversions) turns each SH coefficient into +-itself: exactly,
    and identically on every call (the least-squares solve alone leaves call-to-call noise near 1e-16, which broke
    exact round trips)."""
    for matrix in (FLIP_YZ, [[-1.0, 0, 0], [0, -1.0, 0], [0, 0, 1.0]], [[-1.0, 0, 0], [0, 1.0, 0], [0, 0, -1.0]]):
        first = sh_rotation(torch.as_tensor(matrix, dtype=torch.float64), 3)
        assert torch.equal(first, first.round()) and torch.equal(first.abs(), torch.eye(16, dtype=torch.float64))
        assert all(torch.equal(first, sh_rotation(torch.as_tensor(matrix, dtype=torch.float64), 3)) for _ in range(20))

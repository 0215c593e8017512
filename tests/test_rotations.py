"""Rotations (``lift3d.rotations``): quaternion <-> matrix against independent references, every branch of Shepperd's
method, the Hamilton product as matrix composition, the numpy twins, finite gradients."""

import math

import numpy as np
import pytest
import torch

from lift3d.rotations import (
    matrix_to_quaternion,
    matrix_to_quaternion_np,
    normalize_quaternion,
    quaternion_multiply,
    quaternion_to_matrix,
    quaternion_to_matrix_np,
    so3_exp,
)


def random_quaternions(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def eigenvector_quaternion(R: np.ndarray) -> np.ndarray:
    """The unit quaternion (w >= 0) of R by Bar-Itzhack's symmetric-matrix eigenvector method: a reference that shares
    nothing with Shepperd's branches."""
    (xx, yx, zx), (xy, yy, zy), (xz, yz, zz) = R
    K = np.array([[xx - yy - zz, 0, 0, 0], [yx + xy, yy - xx - zz, 0, 0], [zx + xz, zy + yz, zz - xx - yy, 0],
                  [yz - zy, zx - xz, xy - yx, xx + yy + zz]]) / 3.0
    values, vectors = np.linalg.eigh(K)
    q = vectors[[3, 0, 1, 2], np.argmax(values)]
    return -q if q[0] < 0 else q


def test_the_matrix_is_rodrigues_rotation_of_the_axis_and_angle():
    axis, angle = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64), 1.1
    axis = axis / axis.norm()
    q = torch.cat([torch.tensor([math.cos(angle / 2)], dtype=torch.float64), math.sin(angle / 2) * axis])
    assert torch.allclose(quaternion_to_matrix(q), so3_exp(angle * axis), atol=1e-12)
    # any norm: 3 q is the same rotation; a quarter turn about z takes x to y
    assert torch.allclose(quaternion_to_matrix(3.0 * q), quaternion_to_matrix(q), atol=1e-12)
    quarter = quaternion_to_matrix(torch.tensor([math.sqrt(0.5), 0, 0, math.sqrt(0.5)], dtype=torch.float64))
    x, y = torch.eye(3, dtype=torch.float64)[:2]
    assert torch.allclose(quarter @ x, y)


def test_matrices_are_rotations_and_batches_keep_their_shape():
    q = random_quaternions(24).reshape(2, 3, 4, 4)
    R = quaternion_to_matrix(q)
    assert R.shape == (2, 3, 4, 3, 3)
    assert torch.allclose(R @ R.transpose(-1, -2), torch.eye(3, dtype=R.dtype).expand_as(R), atol=1e-12)
    assert torch.allclose(torch.linalg.det(R), torch.ones(R.shape[:-2], dtype=R.dtype))
    assert matrix_to_quaternion(R).shape == (2, 3, 4, 4)


@pytest.mark.parametrize("largest", [0, 1, 2, 3])
def test_round_trip_through_every_branch_matches_the_eigenvector_method(largest):
    """Quaternions whose largest component is w, x, y or z take each of Shepperd's four branches."""
    q = random_quaternions(200, seed=largest).abs() * 0.3
    q[:, largest] += 1.0
    q = normalize_quaternion(q * torch.where(torch.rand(200, 1, generator=torch.Generator().manual_seed(9)) < 0.5, -1.0, 1.0))
    back = matrix_to_quaternion(quaternion_to_matrix(q))
    assert (back[:, 0] >= 0).all()
    assert torch.allclose(back, q * q[:, :1].sign(), atol=1e-12)  # q itself, sign chosen so that w >= 0
    reference = np.stack([eigenvector_quaternion(R) for R in quaternion_to_matrix(q).numpy()])
    np.testing.assert_allclose(back.numpy(), reference, atol=1e-12)


def test_half_turns_and_the_identity_are_exact():
    assert torch.equal(matrix_to_quaternion(torch.eye(3, dtype=torch.float64)), torch.tensor([1.0, 0, 0, 0], dtype=torch.float64))
    for axis in range(3):
        R = -torch.eye(3, dtype=torch.float64)
        R[axis, axis] = 1.0  # a half turn about the axis
        expected = torch.zeros(4, dtype=torch.float64)
        expected[axis + 1] = 1.0
        assert torch.equal(matrix_to_quaternion(R), expected)
        assert torch.equal(quaternion_to_matrix(expected), R)


def test_the_product_composes_rotations():
    a, b = random_quaternions(10, seed=1), random_quaternions(10, seed=2)
    assert torch.allclose(quaternion_to_matrix(quaternion_multiply(a, b)), quaternion_to_matrix(a) @ quaternion_to_matrix(b),
                          atol=1e-12)
    identity = torch.tensor([1.0, 0, 0, 0], dtype=torch.float64)
    assert torch.equal(quaternion_multiply(identity, b), b) and torch.equal(quaternion_multiply(b, identity), b)


def test_the_numpy_twins_run_the_same_code():
    q = random_quaternions(16, seed=3)
    R = quaternion_to_matrix_np(q.numpy())
    assert isinstance(R, np.ndarray) and R.dtype == np.float64
    assert np.array_equal(R, quaternion_to_matrix(q).numpy())
    assert np.array_equal(matrix_to_quaternion_np(R), matrix_to_quaternion(torch.from_numpy(R)).numpy())
    assert quaternion_to_matrix_np([1.0, 0.0, 0.0, 0.0]).shape == (3, 3)  # lists and float32 arrays are fine too
    assert matrix_to_quaternion_np(np.eye(3, dtype=np.float32)).dtype == np.float64


def test_gradients_are_finite_on_every_branch():
    R = quaternion_to_matrix(torch.eye(4, dtype=torch.float64)).requires_grad_()  # identity and three half turns
    matrix_to_quaternion(R).sum().backward()
    assert torch.isfinite(R.grad).all()
    q = random_quaternions(5).requires_grad_()
    quaternion_to_matrix(q).sum().backward()
    assert torch.isfinite(q.grad).all()

"""Spherical harmonics (``lift3d.sh``): basis against SciPy to degree 4, orthonormality by exact quadrature, color
conventions, the degree helpers."""

import math

import numpy as np
import pytest
import scipy.special
import torch

from lift3d.sh import MAX_BASIS_DEGREE, Y0, degree_of, eval_sh, num_bases, rgb_to_sh, sh_bases, sh_to_color, sh_to_rgb


def _complex_sh(degree: int, order: int, polar: np.ndarray, azimuth: np.ndarray) -> np.ndarray:
    """SciPy's complex SH: ``sph_harm_y`` from 1.15, ``sph_harm`` (order first, azimuth first) before it."""
    if hasattr(scipy.special, "sph_harm_y"):
        return scipy.special.sph_harm_y(degree, order, polar, azimuth)
    return scipy.special.sph_harm(order, degree, azimuth, polar)


def _scipy_real_sh(l_max: int, dirs: np.ndarray) -> np.ndarray:
    """Real SH from SciPy's complex ones, ordered l = 0..l_max, m = -l..l."""
    x, y, z = dirs.T
    theta, phi = np.arccos(np.clip(z, -1, 1)), np.arctan2(y, x)
    columns = []
    for l in range(l_max + 1):  # noqa: E741
        for m in range(-l, l + 1):
            Y = _complex_sh(l, abs(m), theta, phi)
            if m > 0:
                columns.append(math.sqrt(2) * (-1) ** m * Y.real)
            elif m < 0:
                columns.append(math.sqrt(2) * (-1) ** m * Y.imag)
            else:
                columns.append(Y.real)
    return np.stack(columns, -1)


def test_bases_match_scipy_up_to_the_3dgs_sign_convention():
    dirs = torch.nn.functional.normalize(torch.randn(64, 3, dtype=torch.float64), dim=-1)
    ours = sh_bases(4, dirs).numpy()
    reference = _scipy_real_sh(4, dirs.numpy())
    # 3DGS (and gsplat) flip the sign of every basis with odd m relative to SciPy's real SH
    signs = np.array([(-1.0) ** abs(m) for l in range(5) for m in range(-l, l + 1)])  # noqa: E741
    np.testing.assert_allclose(ours, reference * signs, atol=1e-12)
    # the first bands, written out as in the 3DGS CUDA code
    x, y, z = dirs.unbind(-1)
    c1 = 0.4886025119029199
    assert torch.allclose(sh_bases(1, dirs), torch.stack([torch.full_like(x, Y0), -c1 * y, c1 * z, -c1 * x], -1))


def test_bases_are_orthonormal_on_the_sphere():
    # Gauss-Legendre in cos(theta) x uniform phi integrates products of degree <= 8 exactly
    nodes, weights = np.polynomial.legendre.leggauss(8)
    phi = np.arange(16) * 2 * np.pi / 16
    z = np.repeat(nodes, len(phi))
    w = np.repeat(weights, len(phi)) * (2 * np.pi / len(phi))
    r = np.sqrt(1 - z**2)
    dirs = torch.tensor(np.stack([r * np.cos(np.tile(phi, 8)), r * np.sin(np.tile(phi, 8)), z], -1))
    B = sh_bases(4, dirs)
    gram = (B * torch.tensor(w)[:, None]).T @ B
    assert torch.allclose(gram, torch.eye(25, dtype=gram.dtype), atol=1e-12)
    assert torch.equal(sh_bases(2, dirs), B[:, :9])  # a lower degree is the first bands of a higher one


def test_color_conventions():
    rgb = torch.tensor([[0.1, 0.5, 0.9]])
    assert torch.allclose(sh_to_rgb(rgb_to_sh(rgb)), rgb)
    coeffs = torch.zeros(1, 16, 3)
    coeffs[:, 0] = rgb_to_sh(rgb)
    dirs = torch.randn(1, 3)
    for degree in range(4):
        assert torch.allclose(sh_to_color(degree, coeffs, dirs), rgb, atol=1e-6)  # DC only: the same everywhere
    bright = torch.zeros(1, 1, 3)
    bright[0, 0] = torch.tensor([10.0, -10.0, 0.0])
    color = sh_to_color(0, bright, dirs)
    assert color[0, 0] > 1.0 and color[0, 1] == 0.0  # clamped at 0 only, as gsplat and 3DGS


def test_direction_length_and_extra_coefficients_do_not_matter():
    coeffs = torch.randn(5, 16, 3)
    dirs = torch.randn(5, 3)
    assert torch.allclose(eval_sh(1, coeffs, dirs), eval_sh(1, coeffs, 7.0 * dirs), atol=1e-6)
    assert torch.allclose(eval_sh(1, coeffs, dirs), eval_sh(1, coeffs[:, :4], dirs))
    with pytest.raises(ValueError, match="needs 16 coefficients"):
        eval_sh(3, coeffs[:, :9], dirs)


def test_degree_helpers():
    assert [num_bases(d) for d in range(4)] == [1, 4, 9, 16]
    assert [degree_of(k) for k in (1, 4, 9, 16)] == [0, 1, 2, 3]
    with pytest.raises(ValueError):
        degree_of(5)
    with pytest.raises(ValueError):
        num_bases(4)  # Gaussians stop at degree 3
    assert num_bases(4, MAX_BASIS_DEGREE) == 25  # the directional encoding goes one further
    with pytest.raises(ValueError, match="0..4"):
        sh_bases(5, torch.zeros(1, 3))

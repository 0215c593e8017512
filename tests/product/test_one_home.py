"""One home per idea: quaternion <-> matrix math lives in ``lift3d/rotations.py``, the spherical-harmonic basis in
``lift3d/sh.py``, and there is one ``Mesh`` class (``lift3d/meshes/mesh.py``).

Every module of the package is parsed with ``ast`` and each function (and each module's top level) is checked for the
marks of these implementations: the rotation matrix's diagonal ``1 - 2 * (y * y + z * z)``, Shepperd's (or any) read
of a quaternion off a matrix's transposed entry pairs ``m[2][1] - m[1][2]`` and ``m[0][1] + m[1][0]``, and the SH
basis constants (written out, 0.28209479177387814, or computed, ``0.5 / math.sqrt(math.pi)``). The detectors are
shown to fire on small samples, so the package passing is not vacuous.
"""

from __future__ import annotations

import ast
import functools
import math
import re

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "lift3d"
HOMES = {"quaternion_to_matrix": "rotations.py", "matrix_to_quaternion": "rotations.py", "sh_basis": "sh.py"}
MESH_HOME = "meshes/mesh.py"

# the real SH basis constants of degrees 0..3 (3DGS's C0..C3 and tcnn's), by value
SH_CONSTANTS = [
    0.5 / math.sqrt(math.pi), math.sqrt(3.0 / (4.0 * math.pi)), 0.5 * math.sqrt(15.0 / math.pi),
    0.25 * math.sqrt(5.0 / math.pi), 0.25 * math.sqrt(15.0 / math.pi), 0.25 * math.sqrt(35.0 / (2.0 * math.pi)),
    0.5 * math.sqrt(105.0 / math.pi), 0.25 * math.sqrt(21.0 / (2.0 * math.pi)), 0.25 * math.sqrt(7.0 / math.pi),
    0.25 * math.sqrt(105.0 / math.pi), 0.75 * math.sqrt(5.0 / math.pi),  # 0.9461746957575601: 3 x C2's m=0 term
]


# ------------------------------------------------------------------------------------------- the detectors
def _is_square(node: ast.AST) -> bool:
    """``a * a``, ``a ** 2`` or a name like ``yy``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        return ast.dump(node.left) == ast.dump(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        return isinstance(node.right, ast.Constant) and node.right.value == 2
    return isinstance(node, ast.Name) and re.fullmatch(r"([a-z])\1", node.id) is not None


def _is_number(node: ast.AST, value: float) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, int | float) and node.value == value


def _is_rotation_diagonal(node: ast.BinOp) -> bool:
    """``1 - 2 * (a² + b²)``: a rotation matrix's diagonal entry written from a quaternion."""
    if not (isinstance(node.op, ast.Sub) and _is_number(node.left, 1)):
        return False
    product = node.right
    if not (isinstance(product, ast.BinOp) and isinstance(product.op, ast.Mult)):
        return False
    two, total = (product.left, product.right) if _is_number(product.left, 2) else (product.right, product.left)
    return (_is_number(two, 2) and isinstance(total, ast.BinOp) and isinstance(total.op, ast.Add)
            and _is_square(total.left) and _is_square(total.right))


def _entry(node: ast.AST) -> tuple[str, int, int] | None:
    """(matrix, row, column) of a matrix entry: ``m[2][1]``, ``m[..., 2, 1]``, ``m[:, 2, 1]`` or a name ``m21`` / ``zy``."""
    if isinstance(node, ast.Name):
        match = re.fullmatch(r"(\w*?)([0-2xyz])([0-2xyz])", node.id)
        if match and match.group(2) != match.group(3) and (match.group(2) + match.group(3)).isdigit() != (
                match.group(2) + match.group(3)).isalpha():
            row, column = ("012".find(c) if c.isdigit() else "xyz".find(c) for c in match.group(2, 3))
            return match.group(1), row, column
        return None
    if not isinstance(node, ast.Subscript):
        return None
    indices: list[ast.AST] = []
    while isinstance(node, ast.Subscript):  # m[2][1] nests; m[..., 2, 1] is one tuple
        index = node.slice
        indices = (list(index.elts) if isinstance(index, ast.Tuple) else [index]) + indices
        node = node.value
    ints = [i.value for i in indices[-2:] if isinstance(i, ast.Constant) and isinstance(i.value, int)]
    if len(ints) == 2 and ints[0] != ints[1]:
        return ast.dump(node), ints[0], ints[1]
    return None


def _transposed_pair(node: ast.BinOp) -> tuple[str, int, int] | None:
    """(matrix, i, j), i < j, when ``node`` combines the entries (i, j) and (j, i) of one matrix."""
    a, b = _entry(node.left), _entry(node.right)
    if a and b and a[0] == b[0] and (a[1], a[2]) == (b[2], b[1]):
        return a[0], min(a[1], a[2]), max(a[1], a[2])
    return None


def _values(node: ast.AST, out: list[float]) -> float | None:
    """The number a constant expression of literals, ``pi`` and ``sqrt`` computes (None when it is not one); every
    constant sub-expression's value is appended to ``out`` (one pass over the tree)."""
    value = None
    children = [_values(child, out) for child in ast.iter_child_nodes(node)]
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        value = float(node.value)
    elif isinstance(node, ast.Attribute) and node.attr == "pi":
        value = math.pi
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and children[-1] is not None:
        return -children[-1]  # not recorded: its operand was
    elif isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords and \
            getattr(node.func, "attr", getattr(node.func, "id", "")) == "sqrt" and children[-1] is not None:
        value = math.sqrt(children[-1]) if children[-1] >= 0 else None
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
        left, right = children[0], children[-1]
        if left is not None and right is not None and not (isinstance(node.op, ast.Div) and right == 0):
            value = {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right}.get(type(node.op), left / (right or 1))
    if value is not None:
        out.append(value)
    return value


def _sh_constants(scope: ast.AST) -> int:
    """How many SH basis constants (to 1e-12, sign aside) ``scope`` writes out or computes."""
    values: list[float] = []
    _values(scope, values)
    return sum(abs(value) > 0.1 and any(abs(abs(value) - c) < 1e-12 for c in SH_CONSTANTS) for value in values)


def _scopes(tree: ast.Module):
    """(name, node) of every function (methods and nested ones too) and of the module's top level without them."""
    top = ast.Module(body=[s for s in tree.body if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)],
                     type_ignores=[])
    yield "<module>", top
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):  # class-level statements (constants), not its methods
            yield node.name, ast.Module(body=[s for s in node.body if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef)],
                                        type_ignores=[])


def implementations(source: str) -> dict[str, list[str]]:
    """idea -> the scopes of ``source`` that implement it (a scope counts where its own statements show the marks; a
    function's body includes the functions nested in it)."""
    found: dict[str, list[str]] = {idea: [] for idea in HOMES}
    for name, scope in _scopes(ast.parse(source)):
        binops = [node for node in ast.walk(scope) if isinstance(node, ast.BinOp)]
        if sum(map(_is_rotation_diagonal, binops)) >= 2:
            found["quaternion_to_matrix"].append(name)
        differences = {pair for node in binops if isinstance(node.op, ast.Sub) and (pair := _transposed_pair(node))}
        sums = {pair for node in binops if isinstance(node.op, ast.Add) and (pair := _transposed_pair(node))}
        if differences and sums and len(differences) + len(sums) >= 3:  # a matrix's antisymmetric and symmetric parts
            found["matrix_to_quaternion"].append(name)
        if _sh_constants(scope) >= 1:
            found["sh_basis"].append(name)
    return found


def mesh_classes(source: str) -> int:
    return sum(isinstance(node, ast.ClassDef) and node.name == "Mesh" for node in ast.walk(ast.parse(source)))


@functools.cache
def modules() -> dict[str, str]:
    """Every module's source by its path under ``lift3d/``."""
    return {path.relative_to(PACKAGE).as_posix(): path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))}


# --------------------------------------------------------------------------------------------- the package
def test_quaternion_and_sh_math_live_in_their_one_home():
    found = {idea: [] for idea in HOMES}
    for module, source in modules().items():
        for idea, scopes in implementations(source).items():
            found[idea] += [f"{module}::{scope}" for scope in scopes]
    for idea, home in HOMES.items():
        elsewhere = [where for where in found[idea] if not where.startswith(f"{home}::")]
        assert not elsewhere, f"{idea} is implemented outside lift3d/{home}: {elsewhere}; import it from there instead"
        assert found[idea], f"the detector of {idea} no longer finds lift3d/{home}'s own implementation"


def test_there_is_one_mesh_class():
    counts = {module: mesh_classes(source) for module, source in modules().items()}
    assert {module: n for module, n in counts.items() if n} == {MESH_HOME: 1}


# ---------------------------------------------------------------------------------------- the detectors fire
QUAT_TO_MATRIX_NUMPY = """
def rotmat(q):
    w, x, y, z = q / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1.0 - 2.0 * (x**2 + y**2)]])
"""
QUAT_TO_MATRIX_SQUARES = """
class Splat:
    def rotation(self):
        xx, yy, zz = self.x * self.x, self.y * self.y, self.z * self.z
        return [[1 - 2 * (yy + zz), 0, 0], [0, 1 - 2 * (xx + zz), 0], [0, 0, 1 - 2 * (xx + yy)]]
"""
MATRIX_TO_QUAT_SHEPPERD = """
def quat(m):
    s = math.sqrt(1.0 + m[0][0] - m[1][1] - m[2][2]) * 2
    return [(m[2][1] - m[1][2]) / s, s / 4, (m[0][1] + m[1][0]) / s, (m[0][2] + m[2][0]) / s]
"""
MATRIX_TO_QUAT_BATCHED = """
def quats(R):
    w = torch.sqrt(1 + R[..., 0, 0] + R[..., 1, 1] + R[..., 2, 2]) / 2
    x = (R[..., 2, 1] - R[..., 1, 2]) / (4 * w)
    y = (R[..., 0, 2] - R[..., 2, 0]) / (4 * w)
    other = (R[..., 0, 1] + R[..., 1, 0], R[..., 1, 2] + R[..., 2, 1])
    return torch.stack([w, x, y, other[0]], -1)
"""
MATRIX_TO_QUAT_EIGEN = """
def qvec(R):
    (xx, yx, zx), (xy, yy, zy), (xz, yz, zz) = R
    K = np.array([[xx - yy - zz, 0, 0, 0], [yx + xy, yy - xx - zz, 0, 0], [zx + xz, zy + yz, zz - xx - yy, 0],
                  [yz - zy, zx - xz, xy - yx, xx + yy + zz]]) / 3.0
    return np.linalg.eigh(K)[1][:, -1]
"""
SH_LITERAL = """
def encode(d):
    x, y, z = d.unbind(-1)
    return torch.stack([torch.full_like(x, 0.28209479177387814), -0.48860251190291987 * y], -1)
"""
SH_COMPUTED = """
import math
C1 = math.sqrt(3 / (4 * math.pi))
"""
SH_DC_ONLY = """
def rgb(dc):
    return 0.5 + 0.2820947917738781 * dc
"""
HARMLESS = """
import math
class Camera:
    def look(self, m, t):
        angle = 1 - 2 * (t + 0.5)
        sym = m[0][1] + m[1][0]
        return math.sqrt(2.0) * angle, sym, 0.5 / math.pi
"""


@pytest.mark.parametrize(("source", "idea", "scope"), [
    (QUAT_TO_MATRIX_NUMPY, "quaternion_to_matrix", "rotmat"),
    (QUAT_TO_MATRIX_SQUARES, "quaternion_to_matrix", "rotation"),
    (MATRIX_TO_QUAT_SHEPPERD, "matrix_to_quaternion", "quat"),
    (MATRIX_TO_QUAT_BATCHED, "matrix_to_quaternion", "quats"),
    (MATRIX_TO_QUAT_EIGEN, "matrix_to_quaternion", "qvec"),
    (SH_LITERAL, "sh_basis", "encode"),
    (SH_COMPUTED, "sh_basis", "<module>"),
    (SH_DC_ONLY, "sh_basis", "rgb"),
])
def test_the_detectors_fire_on_a_second_implementation(source, idea, scope):
    assert implementations(source)[idea] == [scope]


def test_the_detectors_stay_quiet_on_other_math_and_find_a_second_mesh_class():
    assert implementations(HARMLESS) == {idea: [] for idea in HOMES}
    assert mesh_classes("from dataclasses import dataclass\n@dataclass\nclass Mesh:\n    vertices: object\n") == 1
    assert mesh_classes("class MeshRenderer:\n    pass\n") == 0

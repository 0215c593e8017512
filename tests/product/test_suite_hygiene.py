"""The suite leaves the user's checkout as it found it: a run that names no output_root, started from the checkout (as
the CLI error cases do), writes its run_dir under a temp folder, not ``outputs/`` in the clone (tests/conftest.py); and
the suite's folders mirror the package's, so each test is found beside the code it tests."""

from __future__ import annotations

from lift3d.cli import main
from tests.conftest import REPO, TEST_CONFIGS


def test_a_run_with_the_default_output_root_writes_outside_the_checkout(_session_outputs, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    args = ["train", str(TEST_CONFIGS / "fit-image.yaml"), "tag=hygiene", "trainer.max_steps=2", "trainer.val_check_interval=0",
            "trainer.run_test_after_fit=false", "trainer.enable_progress_bar=false"]
    assert main(args) == 0, capsys.readouterr().err[-2000:]
    runs = list((_session_outputs / "outputs" / "fit-image").glob("hygiene*"))
    assert len(runs) == 1 and (runs[0] / "configs" / "parsed.yaml").is_file()
    assert not runs[0].resolve().is_relative_to(REPO)


# folders of tests/ that hold helpers and data, or checks of no single module (product/), rather than mirror a package
NOT_MIRRORS = {"artifacts", "configs", "js", "plugins", "product", "__pycache__"}


def test_the_tests_mirror_the_package():
    """The layout rule (CONTRIBUTING.md, Tests): every folder under tests/ that holds Python files (except the helper
    and data folders and product/) is a package folder of lift3d/ at the same path, or of benchmarks/ for
    tests/benchmarks/..., and has an __init__.py; a test file at tests/'s top is ``test_NAME.py`` or
    ``test_NAME_FEATURE.py`` for a root module ``lift3d/NAME.py``."""
    tests = REPO / "tests"
    strays = []
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir()):
        relative = folder.relative_to(tests)
        if relative.parts[0] in NOT_MIRRORS or "node_modules" in relative.parts or not any(folder.glob("*.py")):
            continue
        package = REPO / relative if relative.parts[0] == "benchmarks" else REPO / "lift3d" / relative
        if not (package / "__init__.py").is_file():
            strays.append(f"tests/{relative.as_posix()}/ mirrors no package folder ({package.relative_to(REPO)}/ is none)")
        elif not (folder / "__init__.py").is_file():
            strays.append(f"tests/{relative.as_posix()}/ has no __init__.py (test files of one name would clash)")
    roots = {p.stem for p in (REPO / "lift3d").glob("*.py")} - {"__init__", "__main__"}
    for path in sorted(tests.glob("test_*.py")):
        name = path.stem.removeprefix("test_")
        if not any(name == root or name.startswith(root + "_") for root in roots):
            strays.append(f"tests/{path.name} tests no root module lift3d/NAME.py: move it to the folder of its package")
    assert not strays, "\n".join(strays)

"""The CLI answers at once: help, argument errors, --version and info import none of the training stack."""

import subprocess
import sys

import pytest

from tests.conftest import REPO

HEAVY = ("torch", "lightning", "diffusers", "transformers")
# runs lift3d's main in a fresh interpreter and prints, at exit, which heavy packages got imported
PROBE = """
import atexit, sys
atexit.register(lambda: print("IMPORTED:" + ",".join(m for m in {heavy!r} if m in sys.modules), file=sys.stderr))
from lift3d.cli import main
sys.exit(main({argv!r}))
"""


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    code = PROBE.format(heavy=HEAVY, argv=list(argv))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)


def imported(done: subprocess.CompletedProcess) -> list[str]:
    line = [item for item in done.stderr.splitlines() if item.startswith("IMPORTED:")][-1]
    return [name for name in line.removeprefix("IMPORTED:").split(",") if name]


@pytest.mark.parametrize("argv", [["--help"], ["reconstruct", "--help"], ["info"], ["--version"], ["train", "--help"],
                                  ["generate", "--help"], ["poses", "--help"], ["render", "--help"], ["train", "--list"],
                                  ["reconstruct", "--method", "splats"], ["train", "no-such-recipe"]])
def test_help_info_and_argument_errors_import_no_training_stack(argv):
    done = run_cli(*argv)
    assert done.returncode in (0, 2), done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert imported(done) == [], (argv, imported(done))


def test_every_subcommand_has_help_that_imports_nothing_heavy():
    from lift3d.cli import COMMAND_MODULES

    code = ("import sys\nfrom lift3d.cli import build_parser\nbuild_parser()\n"
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO, check=True)
    assert done.stdout.strip() == "", done.stdout
    assert set(COMMAND_MODULES) >= {"train", "reconstruct", "generate", "info", "render"}


def test_help_lists_the_capture_formats_as_the_table_says():
    """The format lists of ``reconstruct --help`` are read from the format modules' source; they match the table."""
    from lift3d.commands.tables import _capture_records, capture_format_lists
    from lift3d.data import formats

    assert capture_format_lists() == (formats.posed_list(), formats.unposed_list())
    assert [r[1] for r in _capture_records()] == [f.name for f in formats.formats()]


def test_info_reads_the_export_table_as_it_is():
    from lift3d.commands.tables import export_format_status, export_formats
    from lift3d.export.formats import export_table, format_status

    table, needs = export_formats()
    registered = export_table()
    assert table == {name: (r.source, r.description) for name, r in registered.items()}
    assert needs == {name: r.check_tool for name, r in registered.items() if r.check_tool is not None} and needs
    assert export_format_status() == format_status()


def test_a_table_written_as_code_is_read_by_importing_it(monkeypatch, tmp_path):
    """Where a FORMAT record is not literals, the help falls back to importing the table (correct, slower)."""
    from lift3d.commands import tables
    from lift3d.data import formats

    (tmp_path / "data" / "formats").mkdir(parents=True)
    (tmp_path / "data" / "formats" / "odd.py").write_text('FORMAT = CaptureFormat(name="odd", description=describe())\n')
    monkeypatch.setattr(tables, "PACKAGE", tmp_path)
    tables._declared_capture_format_lists.cache_clear()
    try:
        assert tables.capture_format_lists() == (formats.posed_list(), formats.unposed_list())
    finally:
        tables._declared_capture_format_lists.cache_clear()


def test_poses_offers_the_matchers_structure_from_motion_knows():
    from lift3d.commands.poses import MATCHERS
    from lift3d.data.sfm import MATCHERS as SFM_MATCHERS

    assert MATCHERS == SFM_MATCHERS


def test_info_reports_gpus_from_nvidia_smi_without_torch(monkeypatch, tmp_path):
    """A machine with two GPUs, one hidden by CUDA_VISIBLE_DEVICES: info lists the visible one as cuda:0."""
    from lift3d.commands import info

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, GPU-aaaa, NVIDIA H200, 143771, 9.0'\necho '1, GPU-bbbb, NVIDIA L4, 23034, 8.9'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert info.nvidia_gpus() == ["cuda:0           NVIDIA H200, 140.4 GiB, sm_90", "cuda:1           NVIDIA L4, 22.5 GiB, sm_89"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert info.nvidia_gpus() == ["cuda:0           NVIDIA L4, 22.5 GiB, sm_89"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert info.nvidia_gpus() == []
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert info.nvidia_gpus() is None

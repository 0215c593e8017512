"""The ``lift3d`` command: one sub-command per module in ``lift3d.commands``."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
import traceback
from collections.abc import Sequence

from lift3d import __version__

# sub-command -> module in lift3d.commands (each has HELP, add_arguments(parser), run(args) -> int)
COMMAND_MODULES: dict[str, str] = {
    "train": "run_modes",
    "validate": "run_modes",
    "test": "run_modes",
    "export": "export",
    "reconstruct": "reconstruct",
    "edit": "edit",
    "poses": "poses",
    "generate": "generate",
    "info": "info",
    "app": "app",
    "view": "view",
    "render": "render",
}


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by input, reported as one clear line instead of a traceback."""
    from lift3d.checkpoints import CheckpointError
    from lift3d.config import ConfigError
    from lift3d.registry import RegistryError

    errors: list[type[BaseException]] = [ConfigError, RegistryError, CheckpointError, FileNotFoundError]
    for module, name in (
        ("lift3d.data.posed_images", "SceneFormatError"),
        ("lift3d.data.reference_image", "ReferenceImageError"),
        ("lift3d.export.formats", "ExportFormatError"),
        ("lift3d.systems.base", "NonFiniteLossError"),
        ("lift3d.gaussians.ply", "PlyFormatError"),
        ("lift3d.guidance.loading", "ModelLoadError"),
    ):
        with contextlib.suppress(ImportError, AttributeError):
            errors.append(getattr(importlib.import_module(module), name))
    return tuple(errors)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lift3d",
        description="Make 3D assets from text (score distillation) or from posed photos (reconstruction).",
    )
    parser.add_argument("--version", action="version", version=f"lift3d {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMAND_MODULES.items():
        module = importlib.import_module(f"lift3d.commands.{module_name}")
        help_text = module.HELP[name] if isinstance(module.HELP, dict) else module.HELP
        sub = commands.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(sub, name)
        sub.set_defaults(_module=module)
    return parser


class _DropTips(logging.Filter):
    """Lightning's advertising tips are noise in a tool's output."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Tip:" not in record.getMessage()


class _StderrHandler(logging.StreamHandler):
    """A stream handler that writes to whatever ``sys.stderr`` is when a record comes (not the one at set-up):
    callers that swap stderr (tests, embedding tools) never leave it writing to a closed stream."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure_logging(verbose: bool = False) -> None:
    """lift3d's own messages as ``lift3d: ...`` lines; Lightning keeps its own handler."""
    logger = logging.getLogger("lift3d")
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("lift3d: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_DropTips())


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    # overrides may come after options (``train cfg.yaml --gpus 0 seed=1``): collect the stragglers
    args, extras = parser.parse_known_args(argv)
    if extras:
        if any(item.startswith("-") for item in extras) or not hasattr(args, "config"):
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        args.config += extras
    configure_logging(args.verbose)
    from lift3d import aftercare

    aftercare.reset()
    try:
        code = int(args._module.run(args) or 0)
    except _user_errors() as error:
        if args.debug:
            traceback.print_exc()
        print(f"lift3d: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as error:
        # a training run stopped by SIGINT / SIGTERM says where its checkpoint is (lift3d.interrupts.Interrupted);
        # DDP ranks other than 0 say nothing
        code = int(getattr(error, "exit_code", 130))
        line = str(error) if hasattr(error, "exit_code") else "interrupted"
        if line:
            print(f"lift3d: {line}", file=sys.stderr)
        return code
    except Exception as error:  # noqa: BLE001  (a bug, not bad input: one line, the traceback with --debug)
        if args.debug:
            traceback.print_exc()
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        print(f"lift3d: internal error: {type(error).__name__}: {first} (lift3d --debug ... shows where; please report "
              "it with that output)", file=sys.stderr)
        return 1
    failed = aftercare.problems()
    if code == 0 and failed:
        print(f"lift3d: trained, but {len(failed)} step(s) after training failed (the checkpoint is good; "
              f"rerun them with lift3d export / lift3d test):", file=sys.stderr)
        for line in failed:
            print(f"  {line}", file=sys.stderr)
        return aftercare.EXIT_TRAINED_WITH_PROBLEMS
    return code


if __name__ == "__main__":
    sys.exit(main())

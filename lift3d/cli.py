"""The ``lift3d`` command: one sub-command per module in ``lift3d.commands``."""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import sys
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path

from lift3d.runs import threads
from lift3d.version import __version__

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
    """Errors caused by input, reported as one clear line instead of a traceback. Only the modules already
    imported are asked (an error class of a module never loaded cannot have been raised), so a failing command
    that did not need torch does not import it to say so."""
    errors: list[type[BaseException]] = [FileNotFoundError]
    for module, name in (
        ("lift3d.config.schema", "ConfigError"),
        ("lift3d.registry", "RegistryError"),
        ("lift3d.checkpoints", "CheckpointError"),
        ("lift3d.data.capture", "SceneFormatError"),
        ("lift3d.data.reference_image", "ReferenceImageError"),
        ("lift3d.export.formats", "ExportFormatError"),
        ("lift3d.systems.base", "NonFiniteLossError"),
        ("lift3d.gaussians.formats.ply", "PlyFormatError"),
        ("lift3d.guidance.loading", "ModelLoadError"),
        ("lift3d.api.exporting", "ExportFailedError"),
        ("lift3d.method_table", "MethodError"),
        ("lift3d.app.recipes", "RecipeError"),
    ):
        if module in sys.modules and hasattr(sys.modules[module], name):
            errors.append(getattr(sys.modules[module], name))
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


# Lightning's lines that say nothing to a lift3d user (devices it did not find, its tips, defaults it applied)
LIGHTNING_NOISE = ("Tip:", "GPU available:", "TPU available:", "HPU available:", "IPU available:", "LOCAL_RANK:",
                   "was configured so", "`Trainer.fit` stopped", "You are using a CUDA device", "Automatic Mixed Precision")
# library warnings that are no news to a lift3d user: lift3d's data loading is deliberate (one process, an iterable
# dataset with a length), short runs log less often than Lightning's default, deprecated arguments are the libraries'
WARNING_NOISE = ("does not have many workers", "`IterableDataset` has `__len__` defined", "smaller than the logging interval",
                 "local_dir_use_symlinks", "The `srun` command is available", "Checkpoint directory", "exists and is not empty")
PACKAGE_DIR = str(Path(__file__).resolve().parent)


class _DropNoise(logging.Filter):
    """Drops LIGHTNING_NOISE records (all of them are shown with -v)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(pattern in message for pattern in LIGHTNING_NOISE)


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file=None,
                 line: str | None = None, verbose: bool = False) -> None:
    """A warning as one ``lift3d: warning: ...`` line. Without -v, library deprecation notices and WARNING_NOISE
    are dropped (they name site-packages files a user cannot act on); with -v every warning shows, with its origin."""
    text = " ".join(str(message).split())
    if not verbose:
        foreign = not str(filename).startswith(PACKAGE_DIR)
        if foreign and issubclass(category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning)):
            return
        if any(pattern in text for pattern in WARNING_NOISE) or category.__name__ == "PossibleUserWarning":
            return
    origin = f" ({category.__name__} at {filename}:{lineno})" if verbose else ""
    print(f"lift3d: warning: {text}{origin}", file=sys.stderr if file is None else file)


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
    """lift3d's own messages as ``lift3d: ...`` lines; Lightning keeps its own handler, less LIGHTNING_NOISE, and
    warnings come as one ``lift3d: warning:`` line each (``show_warning``); -v shows everything."""
    logger = logging.getLogger("lift3d")
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("lift3d: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
    lightning_loggers = [logging.getLogger(name) for name in ("lightning.pytorch.utilities.rank_zero",
                                                              "lightning.fabric.utilities.rank_zero", "lightning.pytorch",
                                                              "lightning.fabric")]
    for each in lightning_loggers + [h for lg in lightning_loggers for h in lg.handlers]:
        for old in [f for f in each.filters if isinstance(f, _DropNoise)]:
            each.removeFilter(old)
        if not verbose:
            each.addFilter(_DropNoise())
    warnings.showwarning = lambda *a, **k: show_warning(*a, **k, verbose=verbose)


def check_arguments(argv: Sequence[str], args: argparse.Namespace) -> None:
    """Arguments no sub-command can use: names that are not UTF-8 (Linux hands undecodable bytes through as
    surrogates, which fail later when a path is written into a config, a log or JSON) and ports out of range."""
    for item in argv:
        if any("\udc80" <= ch <= "\udcff" for ch in item):
            from lift3d.config import ConfigError

            raw = os.fsencode(item)
            raise ConfigError(f"the argument {raw!r} is not valid UTF-8: lift3d writes paths into configs and logs as "
                              "UTF-8; rename the file or folder to a UTF-8 name (e.g. convmv -f latin1 -t utf8 --notest "
                              "NAME), or make a link to it with one")
    for name, example in (("port", "--port 8080"), ("viewer_port", "--viewer-port 8080")):
        value = getattr(args, name, None)
        if isinstance(value, int):
            from lift3d.runs.trainer_checks import check_port

            check_port(f"--{name.replace('_', '-')}", value, example)


def _chain(error: BaseException) -> list[BaseException]:
    """The error and the ones it was raised from or during (a writer's OSError inside a library's RuntimeError)."""
    chain: list[BaseException] = []
    while error is not None and error not in chain and len(chain) < 8:
        chain.append(error)
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return chain


def known_problem(error: BaseException) -> str | None:
    """A message naming the problem and the fix for errors of the machine or of a library's own input checks that
    lift3d did not catch earlier (a full disk, a read-only folder, Lightning refusing a trainer value, memory, a
    name that is not UTF-8); None for anything else (a bug)."""
    for each in _chain(error):
        where = f" ({each.filename})" if isinstance(each, OSError) and each.filename else ""
        if isinstance(each, OSError) and each.errno in (errno.ENOSPC, errno.EDQUOT):
            return (f"the disk is full{where}: {each.strerror or each}; free some space, or write elsewhere with "
                    "output_root=/a/disk/with/space (an export writes beside its input or into the run's save/)")
        if isinstance(each, OSError) and each.errno == errno.EROFS:
            return f"cannot write{where}: the file system is read-only; write elsewhere with output_root=/a/writable/folder"
        if isinstance(each, PermissionError):
            return f"permission denied{where}: make it writable (or readable), or use another folder, e.g. output_root=..."
        if isinstance(each, UnicodeError) and "surrogates not allowed" in str(each):
            return ("a file or folder name is not valid UTF-8 (lift3d writes names into configs and logs as UTF-8): "
                    "rename it to a UTF-8 name (e.g. convmv -f latin1 -t utf8 --notest NAME)")
        if type(each).__name__ == "MisconfigurationException" and type(each).__module__.startswith("lightning"):
            return (f"Lightning refused the trainer settings: {_one_line(str(each))} (set the trainer.* key or the "
                    "--gpus flag it names to a valid value)")
        text = str(each)
        if isinstance(each, MemoryError) or type(each).__name__ == "OutOfMemoryError" or (
                isinstance(each, RuntimeError) and ("not enough memory" in text or "out of memory" in text.lower())):
            return (f"out of memory: {_one_line(text) or type(each).__name__}; use smaller sizes (e.g. data.downscale=2, "
                    "fewer points, a smaller --width) or a machine with more memory")
    return None


BANNER = ("ffmpeg version", "built with", "configuration:", "lib", "=== stderr ===", "[in#", "Copyright")


def _one_line(text: str) -> str:
    """A message on one line: its first line, and where a library appended more (ffmpeg's build banner and log), the
    last line that says something."""
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    said = [line for line in lines[1:] if not line.startswith(BANNER)]
    return f"{lines[0]} ... {said[-1]}" if said else lines[0]


def _close_gloo_group() -> None:
    """A DDP run stopped by bad input leaves its process group open: gloo's threads would then end the interpreter
    with "terminate called without an active exception" after the error line. Closed here (gloo only: closing NCCL
    while another rank may still be in a collective can block)."""
    if "torch" not in sys.modules:
        return
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "gloo":
        dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    threads.configure_cpu_threads()  # before anything imports torch: OpenMP reads its wait policy when it loads
    parser = build_parser()
    # overrides may come after options (``train cfg.yaml --gpus 0 seed=1``): collect the stragglers
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extras = parser.parse_known_args(argv)
    if extras:
        if any(item.startswith("-") for item in extras) or not hasattr(args, "config"):
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        args.config += extras
    configure_logging(args.verbose)
    from lift3d import aftercare

    aftercare.reset()
    try:
        check_arguments(argv, args)
        code = int(args._module.run(args) or 0)
    except BrokenPipeError:
        # the reader of our output went away (``lift3d info | head``): nothing is wrong, and nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except _user_errors() as error:
        if args.debug:
            traceback.print_exc()
        if args.debug or os.environ.get("LOCAL_RANK", "0") == "0":  # one line per machine, not one per GPU
            print(f"lift3d: error: {_one_line(str(error))}", file=sys.stderr)
        _close_gloo_group()
        return 2
    except KeyboardInterrupt as error:
        # a training run stopped by SIGINT / SIGTERM says where its checkpoint is (lift3d.interrupts.Interrupted);
        # DDP ranks other than 0 say nothing
        code = int(getattr(error, "exit_code", 130))
        line = str(error) if hasattr(error, "exit_code") else "interrupted"
        if line:
            print(f"lift3d: {line}", file=sys.stderr)
        if getattr(error, "exit_now", False):  # e.g. a cancelled pycolmap call in a worker thread: do not wait for it
            sys.stdout.flush(), sys.stderr.flush()
            os._exit(code)
        return code
    except Exception as error:  # noqa: BLE001  (a bug, not bad input: one line, the traceback with --debug)
        if args.debug:
            traceback.print_exc()
        problem = known_problem(error)
        if problem is not None:
            print(f"lift3d: error: {problem}", file=sys.stderr)
            return 2
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

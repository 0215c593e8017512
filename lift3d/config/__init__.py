"""The experiment config (structured dataclasses) and ``load_config``: YAML files + dotlist overrides, merged,
resolved and validated with clear errors. Validation lives in ``config.schema``, the layers in ``config.layers``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from lift3d.config.declarations import bounded, choice, step_count
from lift3d.config.layers import (
    COMMAND_LINE,
    dotlist_layer,
    import_plugins,
    in_run_folder,
    load_yaml_layers,
    merge_layers,
    refuse_imports,
    register_resolvers,
    run_imports_allowed,
)
from lift3d.config.schema import ConfigError, Sources, check_config, parse_structured, scheduled

# Lightning's precisions (trainer.precision)
PRECISIONS = ("32-true", "32", "64-true", "64", "16-true", "16", "16-mixed", "bf16-true", "bf16", "bf16-mixed",
              "transformer-engine", "transformer-engine-float16")

# the names the package imports from here (ConfigError and the schema helpers live in config.schema, the field
# declarations in config.declarations)
__all__ = ["CheckpointConfig", "ConfigError", "ExperimentConfig", "TrainerConfig", "ViewerConfig", "bounded", "choice",
           "load_config", "parse_structured", "scheduled", "step_count", "to_yaml"]


@dataclass
class TrainerConfig:
    """Options handed to ``lightning.Trainer``."""

    max_steps: int = step_count(1000, allowed=(-1,))  # optimization steps in the run (-1: no limit)
    val_check_interval: int = step_count(500)  # run validation every N training steps (0: never during training)
    log_every_n_steps: int = step_count(10, kind="kept")  # how often logged scalars are written (steps)
    precision: str = choice("32-true", among=PRECISIONS)  # Lightning precision: 32-true, 16-mixed, bf16-mixed
    accelerator: str = choice("auto", "cpu", "gpu", "cuda", "mps", fold_case=True)  # auto, cpu, gpu
    devices: Any = 1  # number of devices or a list of GPU ids (the CLI's --gpus sets this; -1: every GPU)
    num_nodes: int = bounded(1, low=1)  # machines the run spans (--nodes; under torchrun: its WORLD_SIZE / LOCAL_WORLD_SIZE)
    strategy: str = "auto"  # Lightning strategy; multi-GPU runs use ddp
    # several processes (GPUs, machines) train the recipe's result sooner: every step count (max_steps, intervals,
    # densification, SH and learning-rate schedules) is divided by the total batch over the recipe's, and Adam's rates
    # follow the square-root rule (auto); always: also a larger data.batch_size on one GPU; never: every recipe step runs
    rescale_steps: str = choice("auto", "always", "never")
    # the total batch (views a step over every process) the step counts are written for (0: the recipe's data.batch_size
    # on one GPU); a run that rescales writes its own here, so its parsed.yaml is not rescaled twice
    schedule_batch: int = bounded(0, low=0)
    # DDP: ranks agree on a received SIGTERM every N steps (Lightning: every step, a host sync each; 0: never)
    sigterm_check_every: int = step_count(100, kind="kept")
    num_sanity_val_steps: int = bounded(0, low=0, allowed=(-1,))  # validation batches run before training starts (-1: all)
    limit_val_batches: int | float = bounded(1.0, low=0)  # fraction or number of validation views per check
    gradient_clip_val: float | None = bounded(None, low=0, example=1.0)  # clip gradient norm (None: off)
    enable_progress_bar: bool = True  # rich progress bar with loss, rate and ETA
    deterministic: bool = False  # ask torch for deterministic kernels (slower)
    run_test_after_fit: bool = True  # render the test views (orbit video), then export (export_after_test), when training ends


@dataclass
class CheckpointConfig:
    """When checkpoints are written into the run's ``ckpts/``."""

    every_n_train_steps: int = step_count(1000)  # periodic checkpoint interval in steps (0: only last.ckpt)
    save_last: bool = True  # keep ckpts/last.ckpt up to date at every checkpoint
    keep_periodic: int = bounded(-1, low=0, allowed=(-1,), example=3)  # how many periodic checkpoints to keep (-1: all)
    # also refresh last.ckpt after this many minutes of training (0: off); needs save_last
    every_n_minutes: float = bounded(0.0, low=0)


@dataclass
class ViewerConfig:
    """The live viewer of a training run (``--viewer``; ``lift3d.viewer``): a viser page on ``host:port``."""

    enabled: bool = False  # serve the viewer while training (off: no server, no callback, no cost)
    host: str = "127.0.0.1"  # interface to listen on (0.0.0.0: the LAN)
    port: int = bounded(8080, low=0, high=65535)  # port of the viewer page
    max_share: float = bounded(0.1, above=0, high=1)  # most of the training wall time the viewer's renders may take (0.1: 10%)
    preview_max_side: int = bounded(256, low=16)  # render size (longest side, pixels) while the camera moves
    max_side: int = bounded(1024, low=16)  # render size once the camera stops
    refresh_seconds: float = bounded(2.0, low=0)  # re-render a still view this often as the model trains (0: only when it moves)


@dataclass
class ExperimentConfig:
    """One run: which data, which system, how to train, where outputs go."""

    name: str = "default"  # experiment name: outputs/<name>/...
    tag: str = ""  # run tag: outputs/<name>/<tag>@<timestamp>/ ("run" when empty)
    seed: int = bounded(0, low=0, high=2**32 - 1)  # base seed; each rank uses seed + rank
    output_root: str = "outputs"  # where runs are written
    use_timestamp: bool = True  # append @YYYYmmdd-HHMMSS to the run folder
    resume: str | None = None  # checkpoint to resume from or to evaluate
    imports: list = field(default_factory=list)  # plugin modules (dotted names or .py paths) to import first
    data_type: str = ""  # registered data module name
    data: dict = field(default_factory=dict)  # the data module's config
    system_type: str = ""  # registered system name
    system: dict = field(default_factory=dict)  # the system's config
    trainer: TrainerConfig = field(default_factory=TrainerConfig)  # Lightning trainer options
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)  # checkpoint options
    viewer: ViewerConfig = field(default_factory=ViewerConfig)  # the live viewer while training (--viewer)


def load_config(*yaml_paths: str | Path, overrides: Sequence[str] = (), allow_imports: bool | None = None) -> ExperimentConfig:
    """Merge YAML files (later wins) and dotlist overrides, resolve interpolations, validate.

    ``allow_imports``: True imports every plugin listed in ``imports``; None (the default) refuses those listed by a
    config inside a run folder (``RUN/configs/*.yaml``, and the ``base:`` files it pulls in), which may be someone
    else's, unless ``allow_run_imports()`` was called; False refuses those of every file (overrides excepted).
    Refusal is a ConfigError naming the imports and ``--allow-imports``."""
    if allow_imports is None and run_imports_allowed():
        allow_imports = True
    register_resolvers()
    sources = Sources()
    untrusted: list[str] = []  # the files not trusted to run code that list imports
    for path in yaml_paths:
        layers = load_yaml_layers(Path(path))
        untrusted_file = allow_imports is False or (allow_imports is None and in_run_folder(path))
        # a file trusted itself may still pull in a run folder's config through its base: chain
        untrusted += [label if label == str(path) else f"{label} (the base of {path})" for label, node in layers
                      if node.get("imports") and (untrusted_file or (allow_imports is None and in_run_folder(label)))]
        sources.layers += layers
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value (e.g. system.optimizer.args.lr=0.01)")
    sources.layers.append((COMMAND_LINE, dotlist_layer(overrides)))
    merged = merge_layers([layer for _, layer in sources.layers])
    try:
        OmegaConf.resolve(merged)
    except OmegaConfBaseException as error:
        raise ConfigError(f"could not resolve an interpolation: {str(error).splitlines()[0]}") from None
    imports = [str(entry) for entry in merged.get("imports", []) or []]
    if untrusted:  # what the merged config would import (interpolations resolved), once an untrusted file lists any
        refuse_imports(imports, untrusted[-1])
    import_plugins(imports)
    check_config(ExperimentConfig, merged, "", sources)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ExperimentConfig), merged))  # type: ignore[return-value]


def to_yaml(cfg: Any) -> str:
    """YAML text of a config dataclass or mapping (for configs/parsed.yaml)."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        cfg = OmegaConf.structured(cfg)
    return OmegaConf.to_yaml(OmegaConf.create(cfg) if isinstance(cfg, dict) else cfg)

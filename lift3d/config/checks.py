"""Range checks for config values that the type check cannot catch (a tile of 0 pixels, a negative count), as
``ConfigError`` lines that name the full config key and a value that works."""

from __future__ import annotations

from typing import Any

from lift3d.config.schema import ConfigError


def at_least(key: str, value: Any, minimum: int | float, example: Any, meaning: str = "", allowed: tuple = ()) -> None:
    """Refuse ``value`` below ``minimum`` (``allowed`` lists special values below it, such as -1 for "automatic")."""
    if value is None or value >= minimum or value in allowed:
        return
    also = f" (or {', '.join(map(str, allowed))})" if allowed else ""
    what = meaning or f"at least {minimum}"
    raise ConfigError(f"{key} must be {what}{also}, got {value}: e.g. {key}={example}")


def check_minimums(prefix: str, cfg: Any, rules: dict[str, tuple]) -> None:
    """``rules``: field -> (minimum, example[, allowed values below the minimum]) for the config at ``prefix``."""
    for name, rule in rules.items():
        minimum, example, *allowed = rule
        at_least(f"{prefix}.{name}", getattr(cfg, name), minimum, example, allowed=tuple(allowed[0]) if allowed else ())

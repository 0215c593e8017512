"""Recipe configs ship inside the package (``lift3d/configs``; ``configs/`` in the repo links there)."""

from __future__ import annotations

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def recipe_names() -> list[str]:
    """Names of the recipe configs that ship with lift3d."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def recipe_config(name: str) -> Path:
    """Path of ``configs/<name>.yaml``; an unknown name lists the recipes."""
    path = CONFIG_DIR / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no recipe '{name}'; recipes: {', '.join(recipe_names()) or '(none)'}")
    return path

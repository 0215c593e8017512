"""``python -m benchmarks NAME [args]`` runs the benchmark ``benchmarks/suite/NAME.py`` (its ``main(args)``);
``python -m benchmarks --list`` names every benchmark with what it measures; ``python -m benchmarks NAME --help``
gives a benchmark's options."""

from __future__ import annotations

import ast
import importlib
import re
import sys
from pathlib import Path

SUITE = Path(__file__).resolve().parent / "suite"
USAGE = "usage: python -m benchmarks NAME [args]   (python -m benchmarks --list: the names)"


def benchmarks() -> dict[str, str]:
    """Every benchmark's name and the first sentence of its docstring (read without importing it)."""
    found = {}
    for path in sorted(SUITE.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        paragraph = doc.split("\n\n")[0].replace("\n", " ")
        found[path.stem] = re.split(r"(?<=[.?])\s+(?=[A-Z`])", paragraph)[0]
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    known = benchmarks()
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), USAGE, sep="\n\n", file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "--list":
        width = max(map(len, known))
        for name, what in known.items():
            print(f"{name:<{width}}  {what}")
        return 0
    name, args = argv[0], argv[1:]
    if name not in known:
        hint = " (a benchmark's options follow its name)" if name.startswith("-") else ""
        print(f"python -m benchmarks: no benchmark '{name}'{hint}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    return importlib.import_module(f"benchmarks.suite.{name}").main(args) or 0


if __name__ == "__main__":
    sys.exit(main())

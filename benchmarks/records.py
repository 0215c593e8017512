"""Reading what benchmark scripts print: each result is one JSON line among their other output."""

from __future__ import annotations

import json
from typing import Any


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON objects printed one per line in ``text`` (lines that are not JSON objects are skipped)."""
    records = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records

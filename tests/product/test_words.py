"""The product speaks of itself only: no development history (numbered or ordinal sessions and rounds, issue numbers,
"#NN" references, weeks, dates of work, one-week device scripts) in the tracked files of the package, its tests,
docs, benchmarks, configs and CI. Measurement dates belong in benchmarks/RESULTS.md and nowhere else.

The patterns are narrow on purpose: the web app's page sessions, pytest's session fixtures, ``start_new_session``,
``round()`` and CSS colors are the product's own words (the false-positive samples below keep them so)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import REPO

SCOPE = ("lift3d", "tests", "docs", "benchmarks", "configs", "README.md", "CONTRIBUTING.md", ".ci")
THIS_FILE = "tests/product/test_words.py"  # its samples hold the words it looks for
DATES_ALLOWED = {"benchmarks/RESULTS.md"}  # each figure's measurement date

ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|fourteenth|"
            "fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\\d+(?:st|nd|rd|th)")
PATTERNS = {
    "numbered session": re.compile(r"(?i)\bsessions?[\s_-]*#?\d"),
    "ordinal session": re.compile(rf"(?i)\b(?:{ORDINALS}|last|next|previous|earlier|later|lost)\s+sessions?\b"),
    "numbered round": re.compile(r"(?i)\brounds?\s+#?\d+\b"),
    "round of work": re.compile(r"(?i)\brounds?\s+of\s+(?:review|fix|work|change|call|measurement|benchmark|development|"
                                r"edit|feedback|device)"),
    "ordinal round": re.compile(rf"(?i)\b(?:{ORDINALS}|last|next|previous)\s+rounds?\b"),
    "issue number": re.compile(r"(?i)\b(?:issues?|pull requests?|PRs?)\s*#?\d+"),
    "#NN reference": re.compile(r"(?:^|(?<=[\s(\[]))#\d{2,}(?=[\s).,:\]]|$)"),
    "week": re.compile(r"(?i)\bweek(?:s|ly)?\b"),
    "one-week device script": re.compile(r"\w+_calls\.sh\b"),
    "date": re.compile(r"\b20\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b"),
}

# each pattern fires on the history it is for...
FIRES = {
    "numbered session": ["the session 12 figures", "bash benchmarks/session13_calls.sh formats", "Session 3: GPU"],
    "ordinal session": ["in the thirteenth session", "the tenth session's calls", "measured last session",
                        "the 9th session"],
    "numbered round": ["fixed in round 2", "after round 3", "Round #4"],
    "round of work": ["another round of review", "a round of fixes", "two rounds of device calls"],
    "ordinal round": ["Issue 38's second round", "the first round"],
    "issue number": ["fixed for issue 38", "issues 19, 18", "Issue #40's target", "see PR 12"],
    "#NN reference": ["as #41 asked", "(#123)", "#42"],
    "week": ["the scripts of this week", "one-week scripts", "a weekly run"],
    "one-week device script": ["fast_step_calls.sh", "`bash benchmarks/ddp_calls.sh lego`"],
    "date": ["(H100, 2026-11-21 evening)", "measured 2025-01-31"],
}
# ...and not on the product's own words
QUIET = [
    '@pytest.fixture(scope="session")', "built once per test session (and removed at exit)",
    "Where runs of this session that name no absolute output_root write", "a page session's secret (owner token)",
    "# ---- sessions", "subprocess.Popen(command, start_new_session=True)", "get_session().head(endpoint)",
    "round(x, 3)", "torch.round(t * 255)", "rounded to 3 decimals", "rounds to the other side", "two rounds",
    "the hull is tiny after ``max_rounds`` rounds of sampling", "a round of marching",
    "font: 12px system-ui; color: #666; }", "background: #1e1e1e;", "tests/test_issue_free.py", "issued on load",
    "steps 2026 and 2027", "a 2D prior", "text_encoder_calls",
]


def scanned_files() -> dict[str, str]:
    """Every tracked text file in the product's scope, by its path in the repository."""
    listed = subprocess.run(["git", "ls-files", "-z", "--", *SCOPE], capture_output=True, check=True, cwd=REPO).stdout
    files = {}
    for name in listed.decode().split("\0"):
        path = REPO / name
        if not name or name == THIS_FILE or not path.is_file() or path.is_symlink():
            continue
        try:
            files[name] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # images and other binaries
            continue
    return files


def findings(name: str, text: str) -> list[str]:
    """``path:line: [pattern] line`` for every history word in ``text``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for label, pattern in PATTERNS.items():
            if label == "date" and name in DATES_ALLOWED:
                continue
            if pattern.search(line):
                found.append(f"{name}:{number}: [{label}] {line.strip()[:160]}")
    return found


@pytest.mark.parametrize("label", sorted(PATTERNS))
def test_each_pattern_fires_on_the_history_it_is_for(label):
    assert FIRES[label], label
    for sample in FIRES[label]:
        assert PATTERNS[label].search(sample), (label, sample)


def test_no_pattern_fires_on_the_products_own_words():
    hits = [(label, sample) for sample in QUIET for label, pattern in PATTERNS.items() if pattern.search(sample)]
    assert hits == []


def test_the_product_speaks_of_itself_only():
    files = scanned_files()
    # the scan saw the product, not an empty or wrong checkout
    assert len(files) > 300, len(files)
    for expected in ("README.md", "CONTRIBUTING.md", "benchmarks/RESULTS.md", "benchmarks/__main__.py", ".ci/run",
                     "lift3d/cli.py", "lift3d/configs/reconstruct-gaussians.yaml", "docs/reconstruct.md", "tests/conftest.py"):
        assert expected in files, expected
    assert sum(name.endswith(".py") for name in files) > 250 and sum(name.endswith(".yaml") for name in files) > 20
    found = [hit for name, text in sorted(files.items()) for hit in findings(name, text)]
    assert found == [], "development history in the product (say what the code does, not when or why it changed):\n" + \
        "\n".join(found)

"""mkdocs hooks: the pages generated from the code (the method table, the config reference) and the repository's own
pages (README, CONTRIBUTING, benchmarks/RESULTS.md) in the site, with their links pointing at the site's pages."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
# repository pages shown in the site: site page -> file in the repository
REPOSITORY_PAGES = {"index.md": "README.md", "contributing.md": "CONTRIBUTING.md", "benchmarks.md": "benchmarks/RESULTS.md"}
MARKERS = {"<!-- lift3d:methods -->": "methods_markdown", "<!-- lift3d:config-reference -->": "config_reference_markdown"}


def site_links(markdown: str, page_path: str) -> str:
    """Links to repository files rewritten to the site's pages (``../README.md#x`` -> ``index.md#x``, ``docs/a.md`` ->
    ``a.md``), since the site holds them under other names; ``page_path`` is the page's file in the repository."""
    here = (ROOT / page_path).parent
    targets = {ROOT / repo: site for site, repo in REPOSITORY_PAGES.items()}

    def rewrite(match: re.Match) -> str:
        text, target, anchor = match.group(1), match.group(2), match.group(3) or ""
        if "://" in target:
            return match.group(0)
        resolved = (here / target).resolve()
        if resolved in targets:
            return f"[{text}]({targets[resolved]}{anchor})"
        if resolved.parent == ROOT / "docs" and resolved.suffix == ".md":
            return f"[{text}]({resolved.name}{anchor})"
        return match.group(0)

    return re.sub(r"\[([^\]]*)\]\(([^)#\s]+)(#[^)\s]*)?\)", rewrite, markdown)


def methods_markdown() -> str:
    """The method table as a markdown table: what each front end offers."""
    from lift3d.method_table import methods, needs_text

    rows = ["| method | task | what it does | recipes (stages; refine stages; CPU and sample variants) | needs |",
            "|---|---|---|---|---|"]
    for m in methods():
        recipes = ", ".join(f"`{r}`" for r in m.stages)
        if m.refine_stages:
            recipes += "; refine: " + ", ".join(f"`{r}`" for r in m.refine_stages)
        if m.variants:
            recipes += "; " + ", ".join(f"{k}: `{v}`" for k, v in m.variants.items())
        twin = f" Offline twin: `{m.offline_twin}`." if m.offline_twin else ""
        rows.append(f"| `{m.name}`{' (default)' if m.default else ''} | {m.task} | {m.description}{twin} | {recipes} | "
                    f"{needs_text(m)} |")
    return "\n".join(rows)


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _keys_table(docs) -> list[str]:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    rows += [f"| `{d.key}` | `{_escape(d.type)}` | `{_escape(d.default)}` | {_escape(d.description)} |" for d in docs]
    return rows


def config_reference_markdown() -> str:
    """Every config key: the experiment's own, then each registered part's (the keys under ``data``, ``system``, and a
    part's ``*_type``-named sections), grouped by the package that defines the part."""
    from lift3d.config import ExperimentConfig
    from lift3d.config.describe import describe, part_schemas
    from lift3d.registry import find

    lines = ["## The experiment", "", "Keys at the top of every config (`trainer.*`, `checkpoint.*`, `viewer.*` ...).", "",
             *_keys_table(describe(ExperimentConfig)), ""]
    groups: dict[str, list[str]] = {}
    for name in part_schemas():
        package = find(name).__module__.split(".")[1]
        groups.setdefault(package, []).append(name)
    for package in sorted(groups):
        lines += [f"## Parts in `lift3d.{package}`", ""]
        for name in sorted(groups[package]):
            cls = find(name)
            summary = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
            lines += [f"### `{name}`", "", f"{summary} (`{cls.__module__}.{cls.__qualname__}`)", "",
                      *_keys_table(describe(cls.Config)), ""]
    return "\n".join(lines)


def on_files(files: Files, config) -> Files:
    for site, repo in REPOSITORY_PAGES.items():
        text = (ROOT / repo).read_text(encoding="utf-8")
        files.append(File.generated(config, site, content=site_links(text, repo)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    for marker, function in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, globals()[function]())
    if page.file.generated_by is None:
        markdown = site_links(markdown, f"docs/{page.file.src_uri}")
    return markdown

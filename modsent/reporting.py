"""HTML pages of the Markdown tables, for the Snakemake report.

Every summary of the workflow (Table 1, the per-language tables, the training diagnostics of the
language, sentence-encoding and alignment adapters and of the full baselines, the translation
quality and the inputs) is written as Markdown, which reads well in a terminal and on a code
host, and as a standalone HTML page beside it, which `snakemake --report` embeds: the report
shows Markdown files only as a download, so without the HTML twin its tables stay hidden.

The Markdown is rendered by markdown-it-py (CommonMark with GitHub's pipe tables, raw HTML
off); the page adds a small style sheet (numbers right-aligned as the tables' ``---:`` say,
striped rows, a header that stays in view) and nothing else: no script, no external resource.
"""

from __future__ import annotations

import html
from pathlib import Path

from modsent.io import atomic_path

STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.2em; color: #1d1d1f; }
h1 { font-size: 1.35em; margin: 0 0 .6em; } h2 { font-size: 1.1em; margin: 1.2em 0 .4em; }
p { max-width: 60em; }
table { border-collapse: collapse; margin: .6em 0 1.2em; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #d0d4da; padding: .25em .6em; }
td { max-width: 16em; }  /* long text wraps; the tables stay within a screen */
th { background: #eef1f5; position: sticky; top: 0; max-width: 11em; vertical-align: bottom; }
tbody tr:nth-child(even) { background: #f7f8fa; }
tbody td:first-child { font-weight: 600; }
code { background: #f1f3f5; padding: 0 .25em; border-radius: 3px; }
"""


def markdown_to_html(text: str, title: str | None = None) -> str:
    """A standalone HTML page of the Markdown ``text``; ``title`` defaults to its first heading."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(text)
    if title is None:
        title = next((line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")), "modsent")
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n")


def html_path(md_path: str | Path) -> Path:
    """The HTML twin of a Markdown file: the same path ending in ``.html``."""
    return Path(md_path).with_suffix(".html")


def write_html(md_path: str | Path, out_path: str | Path | None = None, title: str | None = None) -> Path:
    """Render the Markdown file ``md_path`` to ``out_path`` (default: its twin), atomically."""
    md_path = Path(md_path)
    out_path = Path(out_path) if out_path is not None else html_path(md_path)
    page = markdown_to_html(md_path.read_text(encoding="utf-8"), title)
    with atomic_path(out_path) as tmp:
        Path(tmp).write_text(page, encoding="utf-8")
    return out_path

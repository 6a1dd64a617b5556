"""Render a report with jinja2 (undefined names are errors; HTML is autoescaped, and only the SVG that
qrc drew itself is inserted as markup) and write it atomically."""

from __future__ import annotations

import re
from pathlib import Path

from compiler.report.content import Report
from compiler.safe_files import read_own, replace_file

FORMATS = {".md": "report.md.j2", ".html": "report.html.j2", ".htm": "report.html.j2"}


def _md_cell(value) -> str:
    """A Markdown table cell: one line, pipes escaped, and no markup of its own: `<` and `&` become entities
    (no HTML tag or entity can start), and `](` is broken (no inline link or image can form), so a hostile
    layer name cannot inject HTML or a `javascript:` link into a Markdown viewer."""
    text = str(value).replace("&", "&amp;").replace("<", "&lt;").replace("](", "]\\(")
    return text.replace("|", "\\|").replace("\n", " ")


def _md_fenced(text: str) -> str:
    """A Markdown code block whose fence is longer than any run of backticks in `text` (a recipe's strings
    cannot close it)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text.rstrip(chr(10))}\n{fence}\n"


def render(report: Report, suffix: str) -> str:
    """The report as HTML or Markdown, by suffix."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             undefined=jinja2.StrictUndefined, autoescape=jinja2.select_autoescape(("html", "html.j2", "htm.j2")),
                             keep_trailing_newline=True, trim_blocks=False)
    env.filters["md_cell"] = _md_cell
    env.filters["md_fenced"] = _md_fenced
    return env.get_template(FORMATS[suffix.lower()]).render(r=report)


def foreign_report(path: Path) -> bool:
    """Whether a regular file at `path` is something other than a qrc report (its first line or its HTML title
    names one), which a report must not replace unasked."""
    try:
        head = read_own(path, limit=1 << 30)[:4096].decode("utf-8", "replace")
    except (OSError, ValueError):
        return True
    return not (_OWN_REPORT.match(head) or _OWN_TITLE.search(head))


_OWN_REPORT = re.compile(r"# qrc (plan|compile) report: ")
_OWN_TITLE = re.compile(r"<title>qrc (plan|compile) report: ")


def write(report: Report, path: Path) -> None:
    """The report file appears whole or not at all, and never through a link or into a FIFO at its path."""
    replace_file(path, render(report, path.suffix))

"""The worked examples of docs/design/serving.md (and search.md), read back by the tests that check them."""

from pathlib import Path

DOC = Path(__file__).parent.parent / "docs" / "design" / "serving.md"


def section(title: str, doc: Path = DOC) -> str:
    """The text of the ``## title`` section of ``doc`` (up to the next ``##`` heading)."""
    return doc.read_text().split(f"## {title}")[1].split("\n## ")[0]


def table(title: str, header: str, doc: Path = DOC) -> list[list[str]]:
    """The body rows, as stripped cells, of the first table in section ``title`` of ``doc`` whose
    header line starts with ``header``."""
    lines = section(title, doc).splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows

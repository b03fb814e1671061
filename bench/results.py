"""Writing one script's section of bench/RESULTS.md without touching the others.

Each benchmark script owns the text between ``<!-- NAME:start -->`` and
``<!-- NAME:end -->``; running it replaces that block (or appends it).
"""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def write_section(name: str, text: str, path: Path = RESULTS) -> None:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    body = path.read_text() if path.exists() else "# fastload benchmark results\n"
    block = f"{start}\n{text.strip()}\n{end}"
    if start in body and end in body:
        head, rest = body.split(start, 1)
        body = head + block + rest.split(end, 1)[1]
    else:
        body = body.rstrip() + "\n\n" + block + "\n"
    path.write_text(body.rstrip() + "\n")

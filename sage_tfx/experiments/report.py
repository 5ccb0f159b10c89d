"""Writing evaluation results: CSV tables and markdown reports with a regenerated part.

A report file mixes hand-written discussion with tables a harness rewrites on every run: only the
text between :data:`BEGIN` and :data:`END` is replaced, so the discussion survives reruns.
"""
from __future__ import annotations

import csv
import os
from typing import Iterable, Mapping

BEGIN, END = "<!-- BEGIN AUTO -->", "<!-- END AUTO -->"


def write_csv(path: str, rows: Iterable[Mapping]) -> None:
    """Rows (dicts) as CSV; the columns are the union of the keys in first-seen order and
    floats are written with 6 significant digits."""
    rows = list(rows)
    fields: list[str] = []
    for row in rows:
        for key in row:
            if key not in fields:
                fields.append(key)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{x:.6g}" if isinstance(x, float) else x)
                             for k, x in row.items()})


def read_csv(path: str) -> list[dict]:
    """Rows of a CSV written by :func:`write_csv` (values as strings)."""
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_auto_markdown(path: str, auto: str, header: str) -> None:
    """Writes ``auto`` (which must start with BEGIN and end with END) into ``path``.

    An existing file keeps everything outside its markers; a new file (or one without markers)
    gets ``header`` followed by ``auto``.
    """
    if not (auto.lstrip().startswith(BEGIN) and auto.rstrip().endswith(END)):
        raise ValueError("the generated part must be enclosed in the BEGIN/END markers")
    text = None
    if os.path.exists(path):
        with open(path) as f:
            old = f.read()
        if BEGIN in old and END in old:
            before, rest = old.split(BEGIN, 1)
            text = before + auto.strip() + rest.split(END, 1)[1]
    if text is None:
        text = header + auto.strip() + "\n"
    with open(path, "w") as f:
        f.write(text)

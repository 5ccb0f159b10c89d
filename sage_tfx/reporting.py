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

    An existing file keeps everything outside its markers (one without markers keeps its text
    and gets ``auto`` appended); a new file gets ``header`` followed by ``auto``.
    """
    auto = auto.strip()
    if not (auto.startswith(BEGIN) and auto.endswith(END)):
        raise ValueError("the generated part must be enclosed in the BEGIN/END markers")
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
        if BEGIN in text and END in text.split(BEGIN, 1)[1]:
            before, rest = text.split(BEGIN, 1)
            text = before + auto + rest.split(END, 1)[1]
        else:
            text = text.rstrip("\n") + "\n\n" + auto + "\n"
    else:
        text = header + auto + "\n"
    with open(path, "w") as f:
        f.write(text)

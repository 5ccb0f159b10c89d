"""No tracked file points outside the repository: no development machine's paths, no papers
beside the repository; the papers are cited from ``docs/papers.md``, and every link to it
resolves.
"""
from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Built from parts so that this file does not match itself.
MACHINE_PATHS = re.compile("|".join(re.escape(p) for p in (
    "/" + "work/", "/" + "home/", "/" + "Users/", ".." + "/shared", "C:" + "\\Users")))
# .gitignore lists a work directory to keep out of the repository, not a path the code uses.
ALLOWED = {".gitignore"}
# The image's own non-root user's home, a path inside the container.
ALLOWED_LINES = {("Dockerfile", "ENV HOME=/" + "home/sage")}
PAPER_LINK = re.compile(r"papers\.md#([a-z0-9-]+)")


def _tracked() -> list[pathlib.Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [ROOT / p for p in out.stdout.decode().split("\0") if p]


def _text(path: pathlib.Path) -> str | None:
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):  # deleted in the work tree, or a submodule
        return None
    if b"\0" in data[:8192]:
        return None  # binary
    return data.decode("utf-8", errors="replace")


def _hits(text: str) -> list[tuple[int, str]]:
    return [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)
            if MACHINE_PATHS.search(line)]


def test_no_tracked_file_names_a_machine_path_or_shared_papers():
    found = {}
    for path in _tracked():
        rel = str(path.relative_to(ROOT))
        text = _text(path)
        if rel in ALLOWED or text is None:
            continue
        hits = [h for h in _hits(text) if (rel, h[1]) not in ALLOWED_LINES]
        if hits:
            found[rel] = hits[:3]
    assert found == {}, f"paths outside the repository: {found}"


@pytest.mark.parametrize("line", [
    "see /" + "work/shared/reference/README.md", "PYTHON=/" + "home/alice/.venv/bin/python",
    "papers in .." + "/shared/papers/pyramid.md"])
def test_the_scan_flags_machine_paths(line):
    assert _hits(f"ok\n{line}\n") == [(2, line)]


@pytest.mark.parametrize("line", [
    'sage-tfx ptk serve --ledger sqlite:////tmp/ledger.db',  # /tmp examples are fine
    "tmp_path / 'ledger.db'", "docs/papers.md#pyramid", "/root/.pyenv/versions/3.10"])
def test_the_scan_leaves_ordinary_paths_alone(line):
    assert _hits(line) == []


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#{1,6} (.+)$", markdown, re.M)}


def test_every_link_to_papers_md_names_one_of_its_sections():
    anchors = _anchors((ROOT / "docs" / "papers.md").read_text())
    assert {"sage", "ptk-store", "pyramid", "dp-bagging", "draw-and-discard"} <= anchors
    bad = {}
    for path in _tracked():
        text = _text(path)
        if text is None:
            continue
        missing = sorted(set(PAPER_LINK.findall(text)) - anchors)
        if missing:
            bad[str(path.relative_to(ROOT))] = missing
    assert bad == {}, f"links to docs/papers.md sections that do not exist: {bad}"


def test_papers_md_cites_each_paper_with_title_venue_and_link():
    text = (ROOT / "docs" / "papers.md").read_text()
    for title, venue in (("Sage Differentially Private ML Platform", "SOSP"),
                         ("Count Featurization", "S&P"),
                         ("Differentially Private Bagging", "NeurIPS 2019"),
                         ('"Draw and Discard" Machine Learning', "arXiv:1807.04369"),
                         ("Private Transferrable Knowledge", "anonymous submission")):
        assert title in text and venue in text, (title, venue)

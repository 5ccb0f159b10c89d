"""What the demo commands (``python -m sage_tfx.pipelines.<system>_demo``) share: progress lines,
the saved picture and a timed command line whose bad arguments exit with argparse's usage error."""
from __future__ import annotations

import argparse
import time
from typing import Callable


def log(msg: str) -> None:
    """One progress line, flushed at once (the demos run for minutes)."""
    print(msg, flush=True)


def save_figure(fig, path: str, dpi: int = 110) -> str:
    """Lays out, writes and closes a matplotlib figure; returns ``path``."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def timed_main(ap: argparse.ArgumentParser, argv, run: Callable[[argparse.Namespace], object]
               ) -> int:
    """Parses ``argv``, runs ``run(args)`` and prints the elapsed time; a ValueError (a bad
    argument the library refused before writing anything) becomes a usage error (exit 2)."""
    args = ap.parse_args(argv)
    t0 = time.time()
    try:
        run(args)
    except ValueError as e:
        ap.error(str(e))
    log(f"done in {time.time() - t0:.0f}s")
    return 0

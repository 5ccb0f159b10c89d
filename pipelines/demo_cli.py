"""What the demo commands (``python -m sage_tfx.pipelines.<system>_demo``) share: the parser
described by the demo's docstring, the recreated output directory (which holds the demo's
key-encryption key too), progress lines, the saved picture and a timed command line whose bad
arguments exit with argparse's usage error."""
from __future__ import annotations

import argparse
import os
import shutil
import time
from typing import Callable, Optional

# The $SAGE_KEY_PROVIDER value fresh_out set (None: it has set none): a later demo in the same
# process moves the key file into its own --out, a value the user set is never replaced.
_OWN_KEY_PROVIDER: Optional[str] = None


def parser(doc: str) -> argparse.ArgumentParser:
    """The demo's argument parser, described by its docstring's first paragraph (a whole
    sentence, however many lines it takes)."""
    first = " ".join(doc.strip().split("\n\n", 1)[0].split())
    return argparse.ArgumentParser(description=first)


def fresh_out(out: str) -> str:
    """Recreates the demo's output directory and returns it (absolute).

    The blocks, hot windows and window files a demo encrypts are wrapped by the key-encryption
    key ``OUT/kek.json`` unless ``$SAGE_KEY_PROVIDER`` names one, so that a demo writes nothing
    outside ``--out`` (the library's default is the user's ``~/.config/sage-tfx/kek.json``).
    Set in this process's environment, the Beam workers and TFX executors it starts find it too.
    """
    global _OWN_KEY_PROVIDER
    from sage_tfx.ledger import keys

    out = os.path.abspath(out)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    if os.environ.get(keys.PROVIDER_ENV) in (None, "", _OWN_KEY_PROVIDER):
        _OWN_KEY_PROVIDER = "file:" + os.path.join(out, "kek.json")
        os.environ[keys.PROVIDER_ENV] = _OWN_KEY_PROVIDER
    return out


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

"""The one command-line flag that names a ledger: ``--ledger URL`` on every command.

``sage-tfx``, ``sage-tfx compile``, ``sage-tfx ptk`` and ``sage-tfx dnd serve`` all take the
ledger as ``--ledger`` (a URL, or a reference ``env:NAME`` / ``file:/path``). Spellings some
commands used before (``--url``, ``--ledger-url``) still work as deprecated aliases: they set the
same value and print a deprecation note on stderr.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Sequence

LEDGER_FLAG = "--ledger"


class _LedgerAction(argparse.Action):
    """Stores the URL; a deprecated spelling also prints a note on stderr."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if option_string is not None and option_string != LEDGER_FLAG:
            print(f"{parser.prog}: warning: {option_string} is deprecated; use {LEDGER_FLAG}",
                  file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_ledger_argument(parser: argparse.ArgumentParser, *, help: str,  # noqa: A002
                        deprecated: Sequence[str] = (), dest: str = "ledger",
                        **kwargs: Any) -> argparse.Action:
    """Add ``--ledger`` to ``parser``, with ``deprecated`` older spellings of it.

    Args:
      parser: the command's parser.
      help: the flag's help text; a note naming the deprecated spellings is appended.
      deprecated: older option strings (e.g. ``("--url",)``) accepted with a note on stderr.
      dest: the attribute the URL is stored in (default ``ledger``).
      **kwargs: passed to ``add_argument`` (``required``, ``default``, ...).

    Returns:
      The argparse action.
    """
    if deprecated:
        help = f"{help} ({', '.join(deprecated)}: deprecated spelling)"
    return parser.add_argument(LEDGER_FLAG, *deprecated, dest=dest, action=_LedgerAction,
                               metavar="URL", help=help, **kwargs)

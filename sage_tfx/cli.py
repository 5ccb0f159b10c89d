"""The ``sage-tfx`` command: operate a block ledger from the shell.

Examples::

    sage-tfx --ledger sqlite:///ledger.db create-stream flights --epsilon-g 1 --delta-g 1e-6 \
        --granularity time:timestamp:day
    sage-tfx import flights data.csv --scheme time:timestamp:day --block-root blocks/ \
        [--beam-arg=--runner=PortableRunner --beam-arg=--job_endpoint=localhost:8099 ...]
    sage-tfx keys status|migrate|shred|rotate                 # block keys ($SAGE_KEY_PROVIDER)
    sage-tfx blocks flights
    sage-tfx request flights --run-id train-1 --last 30 --epsilon 0.1 --delta 1e-8
    sage-tfx audit --limit 20
    sage-tfx principal add alice --role admin                         # prints alice's token once
    sage-tfx --token file:$HOME/.sage/alice.token principal add etl --role pipeline --pg-role
    sage-tfx principal bind etl --stream flights --context default   # token: $SAGE_LEDGER_TOKEN
    sage-tfx audit anchor --file /mnt/worm/ledger-anchors.jsonl --key-file anchor.key
    sage-tfx verify --anchors /mnt/worm/ledger-anchors.jsonl --key-file anchor.key
    sage-tfx compile --target kubeflow flights-dp --image IMAGE ...   # KFP v2 job JSON
    sage-tfx compile --target airflow gate-stats ...                  # an Airflow DAG file
    sage-tfx submit out/gate-stats.yaml --host URL --param epsilon=0.25  # a KFP run
    sage-tfx ptk plan --ledger sqlite:///ledger.db                    # the PTK store's plan
    sage-tfx dnd serve --ledger sqlite:///ledger.db --stream s ...    # a Draw-and-Discard server

The ledger URL comes from ``--ledger`` (on every command, ``sage_tfx.ledger.flags``), else
``$SAGE_LEDGER_URL``, else ``sqlite:///sage-ledger.db`` in the working directory (either may be a
reference, ``env:NAME`` or ``file:/path``). Once the ledger has principals, the caller's token comes
from ``--token`` (``env:NAME`` / ``file:/path``), else ``$SAGE_LEDGER_TOKEN`` or the file
``$SAGE_LEDGER_TOKEN_FILE`` (``sage-tfx principal --help``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from typing import Optional, Sequence

# Only light modules here: the ledger (and dp_accounting, SciPy) are imported when a command runs,
# so that every --help answers at once.
from sage_tfx import cli_principals
from sage_tfx.errors import InvalidRequestError, SageError
from sage_tfx.ledger import flags, names
from sage_tfx.ledger.names import DEFAULT_CONTEXT

DEFAULT_URL = "sqlite:///sage-ledger.db"


def _table(rows: Sequence[Sequence], header: Sequence[str]) -> str:
    cells = [[str(c) for c in header]] + [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(x: Optional[float]) -> str:
    return "" if x is None else f"{x:.6g}"


def format_blocks(ledger, stream: str, context: str = DEFAULT_CONTEXT,
                  limit: Optional[int] = None) -> str:
    """A table of a stream's blocks with spent and remaining budget."""
    s = ledger.stream(stream)
    blocks = ledger.blocks(stream, context)
    shown = blocks[-limit:] if limit else blocks
    rows = [(b.block_id, b.records, b.status, b.charges, _fmt(b.epsilon_spent),
             _fmt(s.epsilon_g - b.epsilon_spent) if s.mode == names.BASIC else "",
             _fmt(b.delta_spent)) for b in shown]
    header = ("block", "records", "status", "charges",
              "eps spent" + (" (at delta_g)" if s.mode == names.RDP else ""),
              "eps left" if s.mode == names.BASIC else "", "delta spent")
    active = sum(b.active for b in blocks)
    title = (f"stream {s.name}: mode={s.mode} epsilon_g={s.epsilon_g} delta_g={s.delta_g} "
             f"granularity={s.granularity or '-'} context={context}; {len(blocks)} blocks, "
             f"{active} active, {len(blocks) - active} retired")
    if limit and len(blocks) > limit:
        title += f" (last {limit} shown)"
    return title + "\n" + _table(rows, header)


def _print_grant(g) -> None:
    from sage_tfx.ledger import accounting
    cost = (f"epsilon={g.epsilon} delta={g.delta}" if g.event is None
            else f"event={accounting.event_to_json(g.event)}")
    print(f"grant {g.grant_id} run={g.run_id} stream={g.stream} context={g.context} "
          f"status={g.status} {cost}")
    print(f"  blocks ({len(g.blocks)}): {', '.join(g.block_ids[:12])}"
          + (" ..." if len(g.blocks) > 12 else ""))


def _cmd_create_stream(led, a) -> int:
    if a.granularity:
        from sage_tfx.streams.blocks import check_granularity
        check_granularity(a.granularity, flag="--granularity")
    s = led.create_stream(a.name, epsilon_g=a.epsilon_g, delta_g=a.delta_g, mode=a.mode,
                          granularity=a.granularity or "", contexts=a.contexts.split(","),
                          retire_epsilon=a.retire_epsilon)
    print(f"created stream {s.name}: mode={s.mode} epsilon_g={s.epsilon_g} delta_g={s.delta_g} "
          f"contexts={','.join(s.contexts)} retire_epsilon={s.retire_epsilon}")
    return 0


def _cmd_streams(led, a) -> int:
    rows = [(s.name, s.mode, s.epsilon_g, s.delta_g, s.granularity, ",".join(s.contexts),
             len(led.blocks(s.name, s.contexts[0]))) for s in led.streams()]
    print(_table(rows, ("stream", "mode", "epsilon_g", "delta_g", "granularity", "contexts",
                        "blocks")))
    return 0


def _cmd_add_block(led, a) -> int:
    from sage_tfx.ledger import BlockSpec
    led.add_blocks(a.stream, [BlockSpec(a.block_id, a.location, a.start, a.end, a.records)])
    print(f"added block {a.block_id} to {a.stream}")
    return 0


def _cmd_import(led, a) -> int:
    from sage_tfx.streams.blocks import scheme_from_spec
    from sage_tfx.streams.splitter import MalformedRecordsError, split_and_register
    scheme = scheme_from_spec(a.scheme)
    try:
        result = split_and_register(led, a.stream, a.source, scheme, a.block_root,
                                    on_malformed=a.on_malformed, verbose=True,
                                    pipeline_options=list(a.beam_arg) or None,
                                    key_provider=a.key_provider)
    except MalformedRecordsError as exc:  # the hint in the command's own spelling
        raise InvalidRequestError(exc.message(skip_with="--on-malformed skip")) from None
    print(f"imported {len(result.blocks)} encrypted blocks into {a.stream}")
    return 0


def _keys_status(led, a, provider) -> int:
    from sage_tfx.ledger import keys
    live = led.block_keys(a.stream)
    kek = provider(create=False)  # a status never creates a key file
    if kek is None:
        print(f"no key-encryption key {a.key_provider or keys.default_spec()} yet (the first "
              f"import creates it); {len(live)} live key(s) do not open here")
    else:
        print(f"KEK {kek.kek_id} ({kek.previous_versions()} older version(s) not destroyed)")
    rows = []
    for s in [led.stream(a.stream)] if a.stream else led.streams():
        active = set.union(*({b.block_id for b in led.blocks(s.name, c) if b.active}
                             for c in s.contexts))
        mine = [k for k in live if k.stream == s.name]
        rows.append((s.name, len(led.blocks(s.name, s.contexts[0])), len(active), len(mine),
                     len(active - {k.block_id for k in mine}),
                     sum(kek is None or k.kek_id != kek.kek_id for k in mine)))
    print(_table(rows, ("stream", "blocks", "active", "keys", "active without key",
                        "keys under an older KEK version")))
    return 0


def _cmd_keys(led, a) -> int:
    """``sage-tfx keys status|migrate|shred|rotate``: the blocks' data keys (admins only)."""
    from sage_tfx.ledger import access, blockkeys, keys
    led.authorize(access.CONFIGURE)  # before a key file is opened, created or rotated

    def provider(create: bool = True):
        try:
            return keys.provider(a.key_provider, create=create)
        except InvalidRequestError:
            if create:
                raise
            return None

    if a.action == "status":
        return _keys_status(led, a, provider)
    if a.action == "rotate":
        # The systems whose tables hold KEK-wrapped keys register how to re-wrap them.
        import sage_tfx.bagging.cache  # noqa: F401
        import sage_tfx.ptk.windowfiles  # noqa: F401
        import sage_tfx.pyramid.hot  # noqa: F401
        r = blockkeys.rotate_kek(led, provider(), destroy=not a.keep_previous)
        print(f"KEK rotated to {r['kek_id']}{' (resumed)' if r['resumed'] else ''}: "
              f"{r['rewrapped']} key(s) re-wrapped; older versions "
              f"{'destroyed' if r['destroyed'] else 'kept (--keep-previous)'}")
        return 0
    if a.action == "shred":
        r = led.shred_keys(a.stream, hold=a.hold)
        print(f"destroyed {len(r.shredded)} key(s), deleted {r.files_removed} file(s); "
              f"{len(r.held)} retired block(s) still held by a grant" + _wiped(r.wiped))
        return 0
    from sage_tfx.streams.migrate import migrate_ledger
    r = migrate_ledger(led, stream=a.stream, key_provider=a.key_provider, hold=a.hold)
    print(f"encrypted {len(r.encrypted)} block(s), finished {len(r.finished)}, skipped "
          f"{len(r.skipped)}; retired blocks: {r.shred.files_removed} plaintext file(s) "
          f"deleted, {len(r.shred.held)} still held by a grant")
    for stream, block_id, why in r.skipped[:20]:
        print(f"  skipped {stream}/{block_id}: {why}")
    return 0


def _wiped(wiped: Optional[bool]) -> str:
    """What a shred did to the database's copies of the destroyed keys."""
    if wiped is None:
        return ""  # nothing was destroyed, so nothing needed wiping
    return "; database " + ("wiped" if wiped else "not wiped (readers held the WAL: run again)")


def _cmd_blocks(led, a) -> int:
    print(format_blocks(led, a.stream, a.context, a.limit))
    return 0


def _cmd_request(led, a) -> int:
    from sage_tfx.ledger import Window, accounting
    event = accounting.event_from_json(a.event_json) if a.event_json else None
    kwargs = dict(blocks=a.blocks.split(",")) if a.blocks else dict(
        window=Window(last=a.last, min_blocks=a.min_blocks))
    d = led.request(a.stream, run_id=a.run_id, epsilon=a.epsilon, delta=a.delta, event=event,
                    context=a.context, release=not a.reserve, **kwargs)
    if not d.granted:
        print(f"DENIED: {d.reason}")
        return 3
    _print_grant(d.grant)
    if d.replayed:
        print("  (existing grant for this run id; nothing charged)")
    return 0


def _cmd_grant(led, a) -> int:
    g = led.grant(a.grant_id)
    print(g.to_json() if a.json else "")
    if not a.json:
        _print_grant(g)
    return 0


def _cmd_grants(led, a) -> int:
    rows = [(g.grant_id, g.run_id, g.context, g.status, _fmt(g.epsilon), _fmt(g.delta),
             type(g.event).__name__ if g.event else "", len(g.blocks), g.created_at)
            for g in led.grants(a.stream)]
    print(_table(rows, ("grant", "run", "context", "status", "epsilon", "delta", "event",
                        "blocks", "created")))
    return 0


def _cmd_release(led, a) -> int:
    _print_grant(led.release(a.grant_id))
    return 0


def _cmd_cancel(led, a) -> int:
    _print_grant(led.cancel(a.grant_id))
    return 0


def _cmd_retire(led, a) -> int:
    led.retire_block(a.stream, a.block_id, a.reason, context=a.context)
    print(f"retired {a.stream}/{a.block_id}" + ("" if a.context else
                                                "; its data key and local files are destroyed"))
    return 0


def _cmd_audit(led, a) -> int:
    if a.action == "anchor":
        from sage_tfx.ledger.anchor import read_key, write_anchor
        if not a.file:
            raise InvalidRequestError("audit anchor needs --file (the append-only anchor file)")
        rec = write_anchor(led, a.file, read_key(a.key_file) if a.key_file else None)
        print(f"anchored {len(rec['heads'])} chain head(s), up to entry {rec['entries']}, "
              f"{'with' if 'mac' in rec else 'without'} HMAC -> {a.file}")
        return 0
    for e in led.audit_log(a.stream, a.limit):
        print(f"{e.seq:>6} {e.ts} {e.stream or '-':<12} {e.kind:<13} "
              f"{json.dumps(e.payload, sort_keys=True)[:160]}")
    return 0


def _cmd_verify(led, a) -> int:
    report = led.verify_audit()
    print(f"audit chain: {'OK' if report.ok else 'BROKEN'} ({report.message})")
    problems = []
    for s in led.streams():
        p = led.check_consistency(s.name)
        print(f"stream {s.name}: {'consistent' if not p else f'{len(p)} problem(s)'}")
        problems += p
    for p in problems[:50]:
        print("  " + p)
    access = led.check_access()
    print(f"principals and bindings: {'as recorded' if not access else 'TAMPERED OR UNSEALED'}")
    for p in access:
        print("  " + p)
    problems += access
    anchored = True
    if a.anchors:
        from sage_tfx.ledger.anchor import read_key, verify_anchors
        ar = verify_anchors(led, a.anchors, read_key(a.key_file) if a.key_file else None)
        anchored = ar.ok
        print(f"anchors: {'OK' if ar.ok else 'FAILED'} ({ar.message})")
        for p in ar.problems[:50]:
            print("  " + p)
    return 0 if report.ok and not problems and anchored else 4


def build_parser() -> argparse.ArgumentParser:
    """The ``sage-tfx`` argument parser: the ledger flag and one subcommand per operation."""
    p = argparse.ArgumentParser(prog="sage-tfx", description=(
        "Operate a Sage block ledger: streams, blocks, grants and the audit log."))
    flags.add_ledger_argument(
        p, default=None, deprecated=("--ledger-url", "--url"),
        help="ledger URL: sqlite:///path.db or postgresql://user@host:port/db, or a "
                        "reference env:NAME / file:/path (default: $SAGE_LEDGER_URL, else "
                        f"{DEFAULT_URL})")
    cli_principals.token_argument(p)
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("create-stream", help="create a stream with a global (epsilon_g, delta_g)")
    c.add_argument("name")
    c.add_argument("--epsilon-g", type=float, required=True)
    c.add_argument("--delta-g", type=float, required=True)
    c.add_argument("--mode", choices=names.MODES, default=names.BASIC)
    c.add_argument("--granularity",
                   help="block scheme, e.g. time:timestamp:day or hash:user:64:salt")
    c.add_argument("--contexts", default=DEFAULT_CONTEXT,
                   help="comma-separated non-colluding contexts, each with its own budgets")
    c.add_argument("--retire-epsilon", type=float)
    c.set_defaults(fn=_cmd_create_stream)

    c = sub.add_parser("streams", help="list streams")
    c.set_defaults(fn=_cmd_streams)

    c = sub.add_parser("add-block", help="register one block already in block storage")
    c.add_argument("stream")
    c.add_argument("block_id")
    c.add_argument("--location", required=True)
    c.add_argument("--start")
    c.add_argument("--end")
    c.add_argument("--records", type=int)
    c.set_defaults(fn=_cmd_add_block)

    c = sub.add_parser("import",
                       help="split CSV/TFRecord data into blocks (Beam) and register them")
    c.add_argument("stream")
    c.add_argument("source", nargs="+", help="files or globs (CSV with header, or TFRecord)")
    c.add_argument("--scheme", required=True,
                   help="e.g. time:timestamp:day or hash:user_id:64:salt")
    c.add_argument("--block-root", required=True, help="root directory of block storage")
    c.add_argument("--on-malformed", choices=("error", "skip"), default="error")
    c.add_argument("--beam-arg", action="append", default=[], metavar="FLAG",
                   help="one Beam pipeline option for the split, e.g. --beam-arg=--runner="
                        "PortableRunner (repeatable; default DirectRunner)")
    c.add_argument("--key-provider", help="KEK that wraps the blocks' data keys, e.g. "
                                          "file:/path/kek.json (default $SAGE_KEY_PROVIDER)")
    c.set_defaults(fn=_cmd_import)

    c = sub.add_parser("keys", help="block keys: status | migrate (encrypt plaintext blocks) | "
                                    "shred (destroy retired blocks' keys) | rotate (new KEK)")
    c.add_argument("action", choices=("status", "migrate", "shred", "rotate"))
    c.add_argument("--stream", help="one stream (default: all)")
    c.add_argument("--key-provider", help="the KEK (default $SAGE_KEY_PROVIDER, else "
                                          "file:~/.config/sage-tfx/kek.json)")
    c.add_argument("--hold", type=float, help="shred/migrate: seconds a released grant keeps "
                                              "its retired blocks' keys (default "
                                              "$SAGE_KEY_HOLD_SECONDS or 86400)")
    c.add_argument("--keep-previous", action="store_true",
                   help="rotate: re-wrap but keep the older KEK versions")
    c.set_defaults(fn=_cmd_keys)

    c = sub.add_parser("blocks", help="show blocks and remaining budget")
    c.add_argument("stream")
    c.add_argument("--context", default=DEFAULT_CONTEXT)
    c.add_argument("--limit", type=int, help="show only the most recent N blocks")
    c.set_defaults(fn=_cmd_blocks)

    c = sub.add_parser("request", help="request a grant (charged before release)")
    c.add_argument("stream")
    c.add_argument("--run-id", required=True)
    g = c.add_mutually_exclusive_group(required=True)
    g.add_argument("--blocks", help="comma-separated block ids")
    g.add_argument("--last", type=int, help="window: the N most recent blocks with budget")
    c.add_argument("--min-blocks", type=int)
    c.add_argument("--epsilon", type=float)
    c.add_argument("--delta", type=float)
    c.add_argument("--event-json", help="rdp streams: a DpEvent as JSON "
                                        '(e.g. \'{"class": "GaussianDpEvent", "noise_multiplier": '
                                        '5}\')')
    c.add_argument("--context", default=DEFAULT_CONTEXT)
    c.add_argument("--reserve", action="store_true", help="reserve without releasing data")
    c.set_defaults(fn=_cmd_request)

    c = sub.add_parser("grant", help="show one grant")
    c.add_argument("grant_id")
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=_cmd_grant)

    c = sub.add_parser("grants", help="list a stream's grants")
    c.add_argument("stream")
    c.set_defaults(fn=_cmd_grants)

    c = sub.add_parser("release", help="release a reserved grant's data")
    c.add_argument("grant_id")
    c.set_defaults(fn=_cmd_release)

    c = sub.add_parser("cancel", help="cancel a reservation that released no data (refund)")
    c.add_argument("grant_id")
    c.set_defaults(fn=_cmd_cancel)

    c = sub.add_parser("retire", help="retire a block for good")
    c.add_argument("stream")
    c.add_argument("block_id")
    c.add_argument("--reason", default="operator")
    c.add_argument("--context")
    c.set_defaults(fn=_cmd_retire)

    c = sub.add_parser("audit", help="show the audit log, or anchor its heads outside the ledger")
    c.add_argument("action", nargs="?", choices=("show", "anchor"), default="show",
                   help="anchor: append the chain heads to --file (optionally HMAC-signed)")
    c.add_argument("--file", help="anchor file (appended to, never rewritten)")
    c.add_argument("--key-file", help="HMAC-SHA256 key file for the anchor lines")
    c.add_argument("--stream")
    c.add_argument("--limit", type=int, default=50)
    c.set_defaults(fn=_cmd_audit)

    c = sub.add_parser("verify", help="verify the audit hash chain and every stream's budgets")
    c.add_argument("--anchors", help="also check the ledger against this anchor file")
    c.add_argument("--key-file", help="HMAC key the anchor lines were signed with")
    c.set_defaults(fn=_cmd_verify)

    cli_principals.add_parser(sub)

    c = sub.add_parser("compile", add_help=False, prefix_chars="\0",
                       help="compile a pipeline for Kubeflow Pipelines or Airflow: "
                            "compile --target kubeflow|airflow PIPELINE ... (compile --help)")
    c.add_argument("args", nargs=argparse.REMAINDER)
    c.set_defaults(fn=None)
    c = sub.add_parser("submit", add_help=False, prefix_chars="\0",
                       help="start a Kubeflow Pipelines run of a compiled package: "
                            "submit PACKAGE.yaml --host URL --param NAME=VALUE ... (submit --help)")
    c.add_argument("args", nargs=argparse.REMAINDER)
    c.set_defaults(fn=None)

    # The systems' own commands, passed through (each system parses its arguments).
    for name, help_text in (("ptk", "the PTK store: ptk serve|plan --ledger URL ... (ptk --help)"),
                            ("dnd", "Draw-and-Discard: dnd serve --ledger URL ... "
                                    "(dnd serve --help)")):
        c = sub.add_parser(name, add_help=False, prefix_chars="\0", help=help_text)
        c.add_argument("args", nargs=argparse.REMAINDER)
        c.set_defaults(fn=None)
    return p


def _system_command(args: argparse.Namespace) -> int:
    """``sage-tfx ptk ...`` / ``sage-tfx dnd serve ...``: the system's own command line.

    ``sage-tfx --ledger URL ptk plan`` passes the ledger on, like ``ptk plan --ledger URL``."""
    given = [f"{flags.LEDGER_FLAG}={args.ledger}"] if args.ledger else []
    if args.command == "ptk":
        from sage_tfx.ptk import service
        return service.main([*args.args, *given])
    dnd = argparse.ArgumentParser(
        prog="sage-tfx dnd", description="Draw-and-Discard (docs/papers.md): serve one run of "
        "model-level local-DP updates, charged to the ledger before the first update.",
        epilog="sage-tfx dnd serve --help lists the server's options (ledger, stream, run id, "
               "model, unit and privacy parameters)")
    dnd.add_argument("action", choices=("serve",),
                     help="serve: a Draw-and-Discard server for one charged run")
    dnd.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    if not args.args:
        dnd.error("name an action: serve (sage-tfx dnd serve --help)")
    action = dnd.parse_args(args.args)
    from sage_tfx.dnd import server
    return server.main([*action.args, *given])


def _compile(args: argparse.Namespace) -> int:
    """``sage-tfx compile`` / ``submit``: runs the pipeline layer's command
    (``sage_tfx.pipelines.compile`` / ``.submit``) in a child process, as the core never
    imports the pipeline layers."""
    import subprocess
    env = dict(os.environ)
    if args.ledger and args.command == "compile":  # --ledger: the compiled pipeline's ledger
        env["SAGE_LEDGER_URL"] = args.ledger
    return subprocess.call([sys.executable, "-m", f"sage_tfx.pipelines.{args.command}",
                            *args.args], env=env)


def ledger_url(given: Optional[str], environ=os.environ) -> str:
    """``--ledger``, else a reference to ``$SAGE_LEDGER_URL`` (its value, which may hold a
    password, is read only when connecting), else the local SQLite default."""
    if given:
        return given
    return "env:SAGE_LEDGER_URL" if environ.get("SAGE_LEDGER_URL") else DEFAULT_URL


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the ``sage-tfx`` command ``argv``; returns the process exit code."""
    args = build_parser().parse_args(argv)
    if args.command in ("compile", "submit"):
        return _compile(args)
    # Before TensorFlow and Google's client libraries are imported (by a split): no C++ log
    # lines, no notes about Python versions those libraries will stop supporting.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"google\.")
    if args.command in ("ptk", "dnd"):
        return _system_command(args)
    from sage_tfx.ledger import open_ledger
    try:
        with open_ledger(ledger_url(args.ledger), token=args.token) as led:
            return args.fn(led, args)
    except (SageError, ValueError, OSError) as exc:  # bad input: a file, a flag, a right
        print(f"sage-tfx: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

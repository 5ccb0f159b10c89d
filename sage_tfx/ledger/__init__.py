"""The block ledger: the hub every sage-tfx system charges (Sage §3.2, §4).

Public facade::

    from sage_tfx.ledger import open_ledger, Window
    ledger = open_ledger("sqlite:///ledger.db")      # or postgresql://user@host:5432/db
    decision = ledger.request("flights", run_id="r1", window=Window(last=30), epsilon=0.1)

Modules: :mod:`~sage_tfx.ledger.core` (the :class:`Ledger`: streams, blocks, requests, grants),
:mod:`~sage_tfx.ledger.values` (its value objects), :mod:`~sage_tfx.ledger.rows` (the database
rows they are built from, by column name), :mod:`~sage_tfx.ledger.accounting` (privacy
parameters, DpEvents, the basic and rdp accounting modes), :mod:`~sage_tfx.ledger.budget`
(per-block arithmetic of the modes), :mod:`~sage_tfx.ledger.audit` (the hash chains),
:mod:`~sage_tfx.ledger.anchor` (chain heads anchored outside the database),
:mod:`~sage_tfx.ledger.store` (SQLite / PostgreSQL), :mod:`~sage_tfx.ledger.pgserver` (a
throw-away local PostgreSQL server for tests and benchmarks) and :mod:`~sage_tfx.ledger.loadgen`
(multi-process load against a ledger), :mod:`~sage_tfx.ledger.releases` (release once: what each
grant published), :mod:`~sage_tfx.ledger.access` (principals, roles, bindings),
:mod:`~sage_tfx.ledger.pgroles` (PostgreSQL login roles of principals, enforced by the server),
:mod:`~sage_tfx.ledger.leases` (leases and counters shared by processes),
:mod:`~sage_tfx.ledger.secrets` (URLs and tokens by reference),
:mod:`~sage_tfx.ledger.flags` and :mod:`~sage_tfx.ledger.names` (the ``--ledger`` flag, and the
modes, roles and context names a command line parses with),
:mod:`~sage_tfx.ledger.keys` and :mod:`~sage_tfx.ledger.blockkeys` (encrypted blocks' data keys:
wrapped by the KEK, handed out through grants, destroyed at retirement) and
:mod:`~sage_tfx.ledger.schema` (tables and migrations).

The exports are loaded on first use (``sage_tfx._lazy``): importing a light module of the package
(``flags``, ``names``, ``secrets``) does not import the ledger and dp_accounting, which keeps the
command line's ``--help`` fast.
"""
from sage_tfx._lazy import lazy_exports

_LAZY = {
    **dict.fromkeys(("BASIC", "RDP", "MODES", "DEFAULT_CONTEXT"), "sage_tfx.ledger.names"),
    **dict.fromkeys(("AuditEntry", "AuditReport"), "sage_tfx.ledger.audit"),
    **dict.fromkeys(("Ledger", "open_ledger"), "sage_tfx.ledger.core"),
    **dict.fromkeys(("ACTIVE", "CANCELLED", "RELEASED", "RESERVED", "RETIRED", "BlockSpec",
                     "BlockState", "Decision", "Grant", "GrantedBlock", "Stream", "Window"),
                    "sage_tfx.ledger.values"),
}
__all__, __getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())

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
:mod:`~sage_tfx.ledger.keys` and :mod:`~sage_tfx.ledger.blockkeys` (encrypted blocks' data keys:
wrapped by the KEK, handed out through grants, destroyed at retirement) and
:mod:`~sage_tfx.ledger.schema` (tables and migrations).
"""
from sage_tfx.ledger.accounting import BASIC, RDP
from sage_tfx.ledger.audit import AuditEntry, AuditReport
from sage_tfx.ledger.core import Ledger, open_ledger
from sage_tfx.ledger.values import (ACTIVE, CANCELLED, DEFAULT_CONTEXT, RELEASED, RESERVED, RETIRED,
                                    BlockSpec, BlockState, Decision, Grant, GrantedBlock, Stream,
                                    Window)

__all__ = [
    "open_ledger", "Ledger", "Window", "BlockSpec", "BlockState", "Grant", "GrantedBlock",
    "Decision", "Stream", "AuditEntry", "AuditReport", "DEFAULT_CONTEXT", "BASIC", "RDP",
    "ACTIVE", "RETIRED", "RESERVED", "RELEASED", "CANCELLED",
]

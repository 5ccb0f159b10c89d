"""A basic-mode request on PostgreSQL in one server-side call: ``sage_request(...)``.

The function does what :meth:`~sage_tfx.ledger.core.Ledger.request` does in its general path,
for the common case. The client sends one statement, ``CALL sage_request_call(...)``, in
autocommit mode: the procedure runs the function in one transaction and commits it without
waiting for the WAL flush (the row locks go at once), then commits a second transaction that
writes WAL (``pg_logical_emit_message``) with ``synchronous_commit = on``, which returns only once
the WAL is flushed past it — hence past the grant — and only then returns the grant. One
statement, one round trip, no BEGIN/COMMIT messages: about half the client CPU of the same
function sent with BEGIN and COMMIT in a pipeline (which is what runs when a fault-injection
hook, ``Store.before_commit``, must run between the function and its COMMIT). The function:

1. the run-id check;
2. the budget rows locked in ascending ``seq`` (the ledger's one global lock order): the
   requested ids, or the newest ``page`` active blocks of a window, each read through an index;
3. the fit check on exact decimals (``numeric``, as Python's ``Decimal``): ε + charge ≤ ε_g and
   δ + charge ≤ δ_g on every block;
4. the budget UPDATE (set-based, retirement included), the grant INSERT, the head of a free audit
   chain (``sage_audit_chain()``, the same as the general path), the audit entries hashed with
   ``sha256()`` over exactly the bytes :func:`sage_tfx.ledger.audit.entry_hash` hashes.

It writes nothing and returns ``fallback`` whenever the general path must decide: a repeated run
id (replay or misuse), an unknown or retired block, a block without room (a denial, audited with
its reason), a window that must look further back or is short, or a decimal sum with more than 28
significant digits (where Python's ``Decimal`` context would round and the two could differ). The
general path then runs as before, so every error message and denial stays where it was.

**Identical hash material.** ``entry_hash`` hashes the JSON text
``[prev_hash,seq,ts,stream,kind,payload_text]`` (no spaces). Every part the function builds is
ASCII without control characters: names are ``[A-Za-z0-9_.:-]`` (``check_name``), timestamps are
ISO-8601, and ``payload_text`` is ``json.dumps`` with ``ensure_ascii`` (only ``0x20``–``0x7e``).
On such text PostgreSQL's ``to_json(text)`` escapes exactly what Python's ``json.dumps`` escapes
(``"`` and ``\\``), and ``array_to_json`` of names writes ``["a","b"]`` as Python does with
``separators=(",", ":")``. ``tests/ledger/test_pg_request.py`` checks the hashes with
:func:`~sage_tfx.ledger.audit.verify` on adversarial-looking payloads.

rdp-mode streams (RDP curves as JSON floats) always take the general path.
"""
from __future__ import annotations

import uuid
from typing import Optional, Sequence

from sage_tfx.ledger import accounting, audit
from sage_tfx.ledger.queries import LOCATION
from sage_tfx.ledger.values import (RELEASED, RESERVED, Grant, GrantedBlock, Stream, Window,
                                    now)

MAX_DIGITS = 28  # Python's default Decimal precision: larger sums take the general path

# The locking reads of the function, also EXPLAINed by the tests (``{name}``: a parameter).
BLOCK_ROWS = (
    "SELECT u.id, u.block_id, u.seq, u.status, u.eps_spent::numeric AS e, "
    f"u.delta_spent::numeric AS d, {LOCATION} AS location, k.ord "
    "FROM unnest({blocks}::text[]) WITH ORDINALITY AS k(block_id, ord) JOIN budgets u ON "
    "u.stream = {stream} AND u.context = {context} AND u.block_id = k.block_id "
    "ORDER BY u.seq FOR UPDATE OF u")
WINDOW_ROWS = (
    "SELECT u.id, u.block_id, u.seq, u.status, u.eps_spent::numeric AS e, "
    f"u.delta_spent::numeric AS d, {LOCATION} AS location "
    "FROM (SELECT id FROM budgets WHERE stream = "
    "{stream} AND context = {context} AND status = 'active' ORDER BY seq DESC LIMIT {page}) "
    "AS c JOIN budgets u ON u.id = c.id ORDER BY u.seq FOR UPDATE OF u")

_PARAMS = dict(blocks="p_blocks", stream="p_stream", context="p_context", page="p_page")
_FITS = "(x.status = 'active' AND x.e + p_eps <= p_cap_e AND x.d + p_delta <= p_cap_d)"
# Both sums Python forms (ε + charge, then + retire_epsilon) and the δ sum, each exact in
# MAX_DIGITS digits: then Python's rounded Decimal sums equal these exact ones.
_EXACT = ("(sage_exact(x.e + p_eps) AND sage_exact(x.e + p_eps + p_retire_e) AND "
          "sage_exact(x.d + p_delta))")
_STILL = "(x.e + p_eps + p_retire_e <= p_cap_e)"

_ARGS = ("p_stream TEXT, p_context TEXT, p_run_id TEXT, p_blocks TEXT[], p_last INT, "
         "p_required INT, p_page INT, p_eps NUMERIC, p_delta NUMERIC, p_cap_e NUMERIC, "
         "p_cap_d NUMERIC, p_retire_e NUMERIC, p_grant_id TEXT, p_request TEXT, "
         "p_eps_f DOUBLE PRECISION, p_delta_f DOUBLE PRECISION, p_status TEXT, p_ts TEXT, "
         "p_released_at TEXT, p_payload_tail TEXT, p_principal TEXT")
_ARG_NAMES = ", ".join(a.split()[0] for a in _ARGS.split(", "))

FUNCTIONS = [
    # Significant digits of a numeric, counted generously (trailing integer zeros included).
    """CREATE OR REPLACE FUNCTION sage_digits(v NUMERIC) RETURNS INT AS $$
         SELECT length(ltrim(replace(trim_scale(abs(v))::text, '.', ''), '0'))
       $$ LANGUAGE sql IMMUTABLE""",
    # Whether a numeric has at most MAX_DIGITS significant digits (the cheap test first).
    f"""CREATE OR REPLACE FUNCTION sage_exact(v NUMERIC) RETURNS BOOLEAN AS $$
         SELECT (scale(v) < {MAX_DIGITS} AND abs(v) < 10) OR sage_digits(v) <= {MAX_DIGITS}
       $$ LANGUAGE sql IMMUTABLE""",
    # One audit entry: inserted, and its hash returned (the chain's next prev_hash).
    """CREATE OR REPLACE FUNCTION sage_audit_append(p_chain BIGINT, p_seq BIGINT, p_prev TEXT,
         p_ts TEXT, p_stream TEXT, p_kind TEXT, p_payload TEXT) RETURNS TEXT AS $$
       DECLARE digest TEXT := encode(sha256(convert_to(
           '["' || p_prev || '",' || p_seq || ',"' || p_ts || '",' || to_json(p_stream)::text
           || ',"' || p_kind || '",' || to_json(p_payload)::text || ']', 'UTF8')), 'hex');
       BEGIN
         INSERT INTO audit (seq, ts, stream, kind, payload, prev_hash, hash, chain)
           VALUES (p_seq, p_ts, p_stream, p_kind, p_payload, p_prev, digest, p_chain);
         RETURN digest;
       END $$ LANGUAGE plpgsql""",
    f"""CREATE OR REPLACE FUNCTION sage_request({_ARGS})
       RETURNS TABLE (outcome TEXT, block_ids TEXT[], locations TEXT[]) AS $$
       DECLARE
         n INT; total INT; ok BOOLEAN; exact BOOLEAN;
         ids BIGINT[]; bids TEXT[]; locs TEXT[]; retired TEXT[];
         h RECORD; prev TEXT; s BIGINT; b TEXT;
       BEGIN
         -- The COMMIT does not wait for the WAL flush (the row locks go at once); the next
         -- transaction waits for it before the grant is acknowledged (sage_request_call, or
         -- Store.write's flush_after_unlock).
         PERFORM set_config('synchronous_commit', 'off', true);
         PERFORM 1 FROM grants WHERE stream = p_stream AND run_id = p_run_id;
         IF FOUND THEN
           RETURN QUERY SELECT 'fallback'::text, NULL::text[], NULL::text[]; RETURN;
         END IF;
         IF p_blocks IS NOT NULL THEN
           SELECT count(*), coalesce(bool_and({_FITS}), false), coalesce(bool_and({_EXACT}), false),
                  array_agg(x.id ORDER BY x.ord), array_agg(x.block_id ORDER BY x.ord),
                  array_agg(x.location ORDER BY x.ord),
                  array_agg(x.block_id ORDER BY x.ord) FILTER (WHERE NOT {_STILL})
             INTO n, ok, exact, ids, bids, locs, retired
             FROM ({BLOCK_ROWS.format(**_PARAMS)}) AS x;
           IF n <> cardinality(p_blocks) OR NOT ok OR NOT exact THEN
             RETURN QUERY SELECT 'fallback'::text, NULL::text[], NULL::text[]; RETURN;
           END IF;
         ELSE
           WITH locked AS MATERIALIZED ({WINDOW_ROWS.format(**_PARAMS)}),
                chosen AS (SELECT * FROM locked AS x WHERE {_FITS} ORDER BY x.seq DESC
                           LIMIT p_last)
           SELECT (SELECT count(*) FROM locked),
                  (SELECT coalesce(bool_and({_EXACT}), true) FROM locked AS x), count(*),
                  array_agg(x.id ORDER BY x.seq), array_agg(x.block_id ORDER BY x.seq),
                  array_agg(x.location ORDER BY x.seq),
                  array_agg(x.block_id ORDER BY x.seq) FILTER (WHERE NOT {_STILL})
             INTO total, exact, n, ids, bids, locs, retired
             FROM chosen AS x;
           IF NOT exact OR (n < p_last AND total = p_page) OR n < p_required THEN
             RETURN QUERY SELECT 'fallback'::text, NULL::text[], NULL::text[]; RETURN;
           END IF;
         END IF;
         UPDATE budgets SET eps_spent = (eps_spent::numeric + p_eps)::text,
                delta_spent = (delta_spent::numeric + p_delta)::text, charges = charges + 1,
                status = CASE WHEN eps_spent::numeric + p_eps + p_retire_e <= p_cap_e
                              THEN status ELSE 'retired' END
          WHERE id = ANY(ids);
         INSERT INTO grants (grant_id, stream, context, run_id, request, mode, epsilon, delta,
                             event, blocks, status, created_at, released_at, principal)
           VALUES (p_grant_id, p_stream, p_context, p_run_id, p_request, 'basic', p_eps_f,
                   p_delta_f, NULL, array_to_json(bids)::text, p_status, p_ts, p_released_at,
                   p_principal);
         SELECT * INTO h FROM sage_audit_chain();
         s := h.next_seq;
         prev := sage_audit_append(h.chain, s, h.last_hash, p_ts, p_stream, 'grant',
                                   '{{"blocks":' || array_to_json(bids)::text || p_payload_tail);
         FOREACH b IN ARRAY coalesce(retired, '{{}}'::text[]) LOOP
           s := nextval('audit_seq_gen');
           prev := sage_audit_append(h.chain, s, prev, p_ts, p_stream, 'retire',
                     '{{"block":' || to_json(b)::text || ',"context":' || to_json(p_context)::text
                     || ',"grant_id":' || to_json(p_grant_id)::text
                     || ',"principal":' || to_json(p_principal)::text
                     || ',"reason":"budget exhausted"}}');
         END LOOP;
         UPDATE ledger_head SET audit_seq = s, audit_hash = prev WHERE id = h.chain;
         RETURN QUERY SELECT 'granted'::text, bids, locs;
       END $$ LANGUAGE plpgsql""",
    # The request as one statement (see the module docstring): the grant's transaction, then the
    # one whose commit waits for the WAL flush, then the result. Transaction control needs the
    # CALL to run outside a transaction block: the ledger's connections are in autocommit mode.
    f"""CREATE OR REPLACE PROCEDURE sage_request_call({_ARGS},
         INOUT outcome TEXT DEFAULT NULL, INOUT block_ids TEXT[] DEFAULT NULL,
         INOUT locations TEXT[] DEFAULT NULL) AS $$
       BEGIN
         SELECT r.outcome, r.block_ids, r.locations INTO outcome, block_ids, locations
           FROM sage_request({_ARG_NAMES}) AS r;
         COMMIT;  -- synchronous_commit is off for this one (set by sage_request)
         IF outcome = 'granted' THEN
           PERFORM pg_logical_emit_message(true, 'sage-flush', '');
           COMMIT;  -- synchronous_commit on: returns once the WAL is flushed past the grant
         END IF;
       END $$ LANGUAGE plpgsql""",
]

_TYPED = ("%s, %s, %s, %s::text[], %s::int, %s::int, %s::int, %s::numeric, %s::numeric, "
          "%s::numeric, %s::numeric, %s::numeric, %s, %s, %s::float8, %s::float8, %s, %s, %s, %s, "
          "%s")
_SELECT = f"SELECT * FROM sage_request({_TYPED})"  # inside BEGIN ... COMMIT (fault injection)
_CALL = f"CALL sage_request_call({_TYPED}, NULL, NULL, NULL)"
_EMPTY_BLOCKS = '{"blocks":[]'


def request(store, s: Stream, run_id: str, context: str, blocks: Optional[Sequence[str]],
            window: Optional[Window], cost: tuple, request_text: str,
            release: bool) -> Optional[Grant]:
    """The grant made by one ``sage_request`` call, or None if the general path must decide.

    ``cost`` is the validated basic-mode (ε, δ) as floats; their exact decimals are what the
    server adds, as the general path does. Idempotent through the run id: after a lost session
    the retry finds the grant and returns None, and the general path replays it.
    """
    eps, dlt = cost
    grant_id = uuid.uuid4().hex
    ts = now()
    status = RELEASED if release else RESERVED
    text = audit.payload_text({"blocks": [], "context": context, "delta": dlt, "epsilon": eps,
                               "event": None, "grant_id": grant_id, "principal": store.principal,
                               "run_id": run_id, "status": status})
    assert text.startswith(_EMPTY_BLOCKS), text  # sort_keys puts "blocks" first
    cap_e, cap_d = s.exact_caps
    params = (s.name, context, run_id, list(blocks) if blocks is not None else None,
              window.last if window else None, window.required if window else None,
              window.last + 8 if window else None, str(accounting.exact(eps)),
              str(accounting.exact(dlt)), str(cap_e), str(cap_d),
              str(accounting.exact(s.retire_epsilon)), grant_id, request_text, eps, dlt, status,
              ts, ts if release else None, text[len(_EMPTY_BLOCKS):], store.principal)
    # The row locks are released at the grant's COMMIT, before the WAL flush that acknowledges
    # it: overlapping requests queue for the function's work, not for an fsync.
    if store.before_commit is None:  # idempotent: a lost session is retried on a new one
        outcome, block_ids, locations = store.retrying(
            lambda: store.conn.execute(_CALL, params, prepare=True).fetchone(), idempotent=True)
    else:  # a crash test's hook runs between the function and its COMMIT (Store.write)
        outcome, block_ids, locations = store.write(
            lambda: store.conn.execute(_SELECT, params, prepare=True), pipeline=True,
            idempotent=True, flush_after_unlock=True).fetchone()
    if outcome != "granted":
        return None
    return Grant(grant_id, run_id, s.name, context, s.mode, eps, dlt, None,
                 tuple(GrantedBlock(b, loc if release else None)
                       for b, loc in zip(block_ids, locations)), status, ts)


def flush_wal(store) -> None:
    """PostgreSQL: makes the current transaction's COMMIT wait until the WAL is flushed past
    every commit visible now (SQLite: nothing to do, its writes fsync before they return).

    It writes a WAL record in the transaction, so the commit (``synchronous_commit = on``)
    waits for the flush. Used when a grant is replayed: its first attempt may have committed it
    without waiting for the flush (``sage_request_call``, ``flush_after_unlock``) and lost its
    session before that flush; the replay is acknowledged only after this commit.
    """
    if store.kind == "postgresql":
        store.conn.execute("SELECT pg_logical_emit_message(true, 'sage-flush', '')")

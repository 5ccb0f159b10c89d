"""SQL shared by the SQLite and PostgreSQL request paths (:mod:`store`, :mod:`pgrequest`)."""

# A block's location is kept in its budget rows (schema 3), so a request reads one row per
# block instead of probing ``blocks`` too. Rows written without it (by an older version of this
# code on a migrated ledger) read it from ``blocks``: COALESCE runs that lookup only for them.
LOCATION = ("COALESCE(u.location, (SELECT b.location FROM blocks b WHERE b.stream = u.stream "
            "AND b.block_id = u.block_id))")

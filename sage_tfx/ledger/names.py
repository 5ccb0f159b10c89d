"""The ledger's names a command line parses with: accounting modes, the default context, roles
and the token variables.

Their homes re-export them (:mod:`~sage_tfx.ledger.accounting`, :mod:`~sage_tfx.ledger.values`,
:mod:`~sage_tfx.ledger.access`); they are defined here, in a module that imports nothing, so that
``sage-tfx --help`` and every parser of the command line build without dp_accounting (SciPy),
which takes seconds to import.
"""

# Accounting modes of a stream (sage_tfx.ledger.accounting).
BASIC = "basic"
RDP = "rdp"
MODES = (BASIC, RDP)

# The budget list a stream has when no contexts are configured (sage_tfx.ledger.values).
DEFAULT_CONTEXT = "default"

# Roles of a principal and where a caller's token comes from (sage_tfx.ledger.access).
ADMIN = "admin"
PIPELINE = "pipeline"
AUDITOR = "auditor"
CLIENT = "client"
ROLES = (ADMIN, PIPELINE, AUDITOR, CLIENT)
TOKEN_ENV = "SAGE_LEDGER_TOKEN"
TOKEN_FILE_ENV = "SAGE_LEDGER_TOKEN_FILE"

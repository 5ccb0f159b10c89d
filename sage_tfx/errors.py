"""Errors raised by the sage-tfx core.

Every error that reports bad input subclasses ``ValueError`` so callers can catch input problems
in one place; raising one of these guarantees that nothing was written.
"""


class SageError(Exception):
    """Base class of sage-tfx errors."""


class InvalidPrivacyParameterError(SageError, ValueError):
    """An epsilon, delta or DpEvent that cannot be accounted (NaN, negative, delta >= 1, ...)."""


class AccountingModeError(SageError, ValueError):
    """A request whose form does not match the stream's accounting mode."""


class UnknownStreamError(SageError, ValueError):
    """The named stream is not in the ledger."""


class UnknownBlockError(SageError, ValueError):
    """A named block is not in the stream."""


class RetiredBlockError(SageError, ValueError):
    """A named block is retired: no charge will ever be accepted on it again."""


class InvalidRequestError(SageError, ValueError):
    """A malformed request (empty block list, bad window, conflicting run id, ...)."""


class GrantStateError(SageError, ValueError):
    """An operation that the grant's state forbids (e.g. cancelling released data)."""


class MissingGrantError(SageError, ValueError):
    """A DP component was run without a grant, or with a grant it cannot use."""


class ReleaseConflictError(GrantStateError):
    """A second, different release under one grant and name: one charge buys one release."""


class AuthenticationError(SageError, PermissionError):
    """The caller presented no credential, or one that no active principal holds (HTTP 401)."""


class PermissionDeniedError(SageError, PermissionError):
    """The authenticated principal's roles or bindings do not allow the action (HTTP 403)."""


class LeaseTimeoutError(SageError, TimeoutError):
    """An exclusive lease stayed held by another process past the caller's deadline."""


class GrantTooSmallError(InvalidPrivacyParameterError):
    """The grant buys nothing (e.g. DP bagging: not one noisy label fits its ε, δ): refused
    rather than run with an empty or constant output."""

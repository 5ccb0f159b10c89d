"""What every sage-tfx HTTP service shares: authentication, body limits, error mapping.

The PTK store and the Draw-and-Discard server (and any later service) are FastAPI apps. Each
endpoint depends on :meth:`Authenticator.require` with the roles it admits; callers present
``Authorization: Bearer <token>``, a token the ledger issued (:mod:`sage_tfx.ledger.access`).
A ledger still in open mode (no principal: one user, the embedded default) has no tokens to
check, so the service makes one itself at start (like Jupyter's), writes it to a 0600 file and
admits only callers who present it: every endpoint authenticates in every mode.

**Authenticate first.** A typed JSON body is read by :func:`json_body`, a dependency that runs
after the route's authentication and role checks: a caller without a valid token gets 401 (and
one in the wrong role 403) whatever it sends, never 422 for a body it had no right to send.
(FastAPI parses a body parameter before any dependency runs.) :func:`serve_schema` documents such
bodies in the OpenAPI schema as FastAPI would.

:class:`BodyLimit` refuses a body larger than the service's limit with 413 before reading it
(Content-Length) or as soon as a chunked body passes it: it answers 413 itself at that moment,
whatever the framework then makes of the interrupted read. :func:`install_error_handlers` maps
:class:`~sage_tfx.errors.AuthenticationError` to 401,
:class:`~sage_tfx.errors.PermissionDeniedError` to 403 and bad input (``ValueError``) to 400;
:func:`error_response` and :data:`AUTH_ERRORS` document them. FastAPI is imported by the
services only.
"""
from __future__ import annotations

import inspect
import os
import secrets as token_rng
import threading
import time
from typing import Callable, Optional

from sage_tfx.errors import AuthenticationError, PermissionDeniedError
from sage_tfx.ledger import access, open_ledger

DEFAULT_MAX_BODY = 1024 * 1024  # bytes
_WWW = {"WWW-Authenticate": 'Bearer realm="sage-tfx"'}


class BodyLimit:
    """ASGI middleware: 413 for any request body over ``max_bytes`` (nothing past it is read)."""

    def __init__(self, app, max_bytes: int = DEFAULT_MAX_BODY):
        self.app, self.max_bytes = app, int(max_bytes)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    return await _reply(send, 400, b'{"error": "bad Content-Length"}')
                if declared > self.max_bytes:
                    return await _reply(send, 413, self._too_large())
        seen = 0
        started = refused = False

        async def limited_receive():
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # A chunked body just passed the limit. Answer 413 now: the app sees its read
                    # fail, and a framework may turn that into an answer of its own (FastAPI: a
                    # 400 "error parsing the body"), which the client must not get instead.
                    if not started and not refused:
                        refused = True
                        await _reply(send, 413, self._too_large())
                    raise _TooLarge()
            return message

        async def tracking_send(message):
            nonlocal started
            if refused:
                return  # the 413 is the answer; drop what the app makes of the failed read
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started and not refused:
                await _reply(send, 413, self._too_large())

    def _too_large(self) -> bytes:
        return b'{"error": "request body larger than %d bytes"}' % self.max_bytes


class _TooLarge(Exception):
    pass


async def _reply(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class Authenticator:
    """Checks bearer tokens against the ledger's principals (cached for ``cache_seconds``).

    Args:
      ledger_url: the ledger whose principals authenticate callers (a reference is fine).
      token: this service's own ledger credential (default: the environment's).
      open_token_file: where to write the token a ledger in open mode is served with
        (default: a 0600 file in the working directory, ``.sage-service-token``).
      cache_seconds: how long a checked token stays valid without asking the ledger again
        (a disabled principal is refused within this time).
    """

    def __init__(self, ledger_url: str, *, token: Optional[str] = None,
                 open_token_file: Optional[str] = None, cache_seconds: float = 5.0):
        self._ledger = open_ledger(ledger_url, token)
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, access.Principal]] = {}
        self.cache_seconds = cache_seconds
        self.open_token: Optional[str] = None
        self.open_token_file: Optional[str] = None
        if self._ledger.open_mode:
            self.open_token = access.TOKEN_PREFIX + token_rng.token_urlsafe(32)
            self.open_token_file = os.path.abspath(open_token_file or ".sage-service-token")
            # A new 0600 file renamed into place: never written through a link someone put
            # there, never into an existing file whose mode lets others read it.
            tmp = f"{self.open_token_file}.{token_rng.token_hex(8)}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.open_token + "\n")
            os.replace(tmp, self.open_token_file)

    def close(self) -> None:
        """Closes the ledger connection the authenticator reads principals from."""
        self._ledger.close()

    def principal(self, authorization: Optional[str]) -> access.Principal:
        """The principal of an ``Authorization`` header. Raises AuthenticationError."""
        if not authorization or not authorization.startswith("Bearer "):
            raise AuthenticationError("send Authorization: Bearer <token>")
        token = authorization[len("Bearer "):].strip()
        if self.open_token is not None:
            if not token_rng.compare_digest(token.encode(), self.open_token.encode()):
                raise AuthenticationError("unknown token")
            return access.Principal("local", frozenset(access.ROLES))
        now = time.monotonic()
        key = access.token_digest(token)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] > now:
                return hit[1]
            p = self._ledger.authenticate(token)
            if len(self._cache) > 10000:
                self._cache.clear()
            self._cache[key] = (now + self.cache_seconds, p)
            return p

    def authorize(self, principal: access.Principal, action: str, *, stream: str,
                  context: str) -> None:
        """Checks that an authenticated caller may ``action`` on (stream, context) — for a
        pipeline principal, that it is bound there (``Ledger.authorize``).

        Raises:
          PermissionDeniedError: it may not.
        """
        with self._lock:
            self._ledger.authorize(action, stream=stream, context=context, principal=principal)

    def require(self, *roles: str) -> Callable:
        """A FastAPI dependency: the caller's principal, which must hold one of ``roles``.

        The credential is declared as the OpenAPI ``HTTPBearer`` security scheme (not as a plain
        header parameter), so clients and fuzzers see how to authenticate.
        """
        from fastapi import Security
        from fastapi.security import HTTPAuthorizationCredentials

        def dependency(cred: Optional[HTTPAuthorizationCredentials] = Security(_bearer_scheme())
                       ) -> access.Principal:
            p = self.principal(None if cred is None else f"Bearer {cred.credentials}")
            if not (p.roles & set(roles)) and not p.has(access.ADMIN):
                raise PermissionDeniedError(
                    f"principal {p.name!r} (roles {sorted(p.roles)}) may not call this "
                    f"endpoint: it needs one of {sorted(roles)}")
            return p

        return dependency


def json_body(model) -> Callable:
    """A FastAPI dependency: the request's JSON body validated as the pydantic ``model``.

    Declare it after the route's authentication (``dependencies=[Depends(auth...)]`` or an
    earlier parameter): FastAPI solves dependencies in order, so the body is read only once
    the caller is known to be allowed, while a body *parameter* would be parsed (and a bad one
    answered 422) before any dependency runs. A body that is not JSON or does not fit ``model``
    is a 422 (``RequestValidationError``), a declared non-JSON media type a 415; a body past
    the limit is a 413 from :class:`BodyLimit`. :func:`serve_schema` documents the body.
    """
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import ValidationError
    from starlette.requests import Request

    async def dependency(request):
        kind = request.headers.get("content-type", "application/json").split(";")[0].strip()
        if kind != "application/json" and not kind.endswith("+json"):
            raise _Unsupported(JSONResponse(
                {"error": f"send application/json, not {kind[:80]!r}"}, status_code=415))
        try:
            return model.model_validate_json(await request.body())
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False, include_context=False,
                                                    include_input=False)) from None

    # FastAPI reads a dependency's parameters from its signature: this one takes the request.
    dependency.__signature__ = inspect.Signature([inspect.Parameter(
        "request", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Request)])
    dependency.body_model = model
    return dependency


class _Unsupported(Exception):
    """A body of a media type the endpoint does not take (answered with ``response``)."""

    def __init__(self, response):
        super().__init__("unsupported media type")
        self.response = response


def error_response(description: str, fields: tuple = ("error",)) -> dict:
    """The OpenAPI ``responses`` entry of an error answer: a JSON object of string ``fields``."""
    return {"description": description, "content": {"application/json": {"schema": {
        "type": "object", "properties": {f: {"type": "string"} for f in fields}}}}}


# What every authenticated endpoint may answer besides its own results and errors.
AUTH_ERRORS = {401: error_response("no or unknown bearer token"),
               403: error_response("the principal's role (or binding) does not allow this call"),
               413: error_response("request body larger than the service's limit")}


def serve_schema(app, auth: "Authenticator") -> None:
    """Serves the app's OpenAPI schema at ``/openapi.json`` to any authenticated principal.

    The app must be built without FastAPI's own open routes (``FastAPI(openapi_url=None,
    docs_url=None, redoc_url=None)``): every endpoint authenticates, the schema's too. Bodies
    read with :func:`json_body` are documented as FastAPI documents a body parameter (the
    model under ``components/schemas``, a required ``application/json`` request body).
    """
    from fastapi import Depends
    from fastapi.routing import APIRoute

    generate = app.openapi

    def schema() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        out = generate()  # FastAPI's, which it keeps in app.openapi_schema: completed here once
        components = out.setdefault("components", {}).setdefault("schemas", {})
        for route in app.routes:
            if not isinstance(route, APIRoute):
                continue
            for dep in route.dependant.dependencies:
                model = getattr(dep.call, "body_model", None)
                if model is None:
                    continue
                doc = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(doc.pop("$defs", {}))
                components[model.__name__] = doc
                for method in route.methods:
                    out["paths"][route.path_format][method.lower()]["requestBody"] = {
                        "required": True, "content": {"application/json": {"schema": {
                            "$ref": f"#/components/schemas/{model.__name__}"}}}}
        return out

    app.openapi = schema

    @app.get("/openapi.json", include_in_schema=False)
    def openapi(_=Depends(auth.require(*access.ROLES))):
        return app.openapi()


def _bearer_scheme():
    from fastapi.security import HTTPBearer
    return HTTPBearer(auto_error=False, scheme_name="sageBearer",
                      description="a token the ledger issued to the caller, or the service's own "
                                  "token on an open-mode ledger")


def install_error_handlers(app) -> None:
    """401 / 403 / 400 (and :func:`json_body`'s 415) JSON answers for the project's errors
    (nothing was changed)."""
    from fastapi.responses import JSONResponse

    async def unauthenticated(_request, exc):
        return JSONResponse({"error": str(exc)}, status_code=401, headers=_WWW)

    async def forbidden(_request, exc):
        return JSONResponse({"error": str(exc)}, status_code=403)

    async def bad_input(_request, exc):
        return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=400)

    async def unsupported(_request, exc):
        return exc.response

    app.add_exception_handler(AuthenticationError, unauthenticated)
    app.add_exception_handler(_Unsupported, unsupported)
    app.add_exception_handler(PermissionDeniedError, forbidden)
    app.add_exception_handler(ValueError, bad_input)

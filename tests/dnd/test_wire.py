"""The server's transport: uvloop and httptools, and the compact binary update encoding."""
from sage_tfx.dnd.server import fast_server_options


def test_the_server_runs_on_uvloop_and_httptools():
    import asyncio

    import uvicorn
    opts = fast_server_options()
    assert opts == {"loop": "uvloop", "http": "httptools"}  # both are pinned in the lock
    async def app(scope, receive, send):  # pragma: no cover - never called
        pass
    config = uvicorn.Config(app, host="127.0.0.1", **opts)
    config.load()  # resolves the protocol class
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    assert config.http_protocol_class is HttpToolsProtocol
    import uvloop
    loop = uvloop.new_event_loop()
    try:
        assert isinstance(loop, asyncio.AbstractEventLoop)
    finally:
        loop.close()

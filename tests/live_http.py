"""Real HTTP for the service tests: an app on uvicorn on 127.0.0.1, and requests that
``httpx`` does not send (a chunked body, written on a raw socket)."""
import contextlib
import socket
import threading
import time
import urllib.parse


@contextlib.contextmanager
def serving(app):
    """Runs ``app`` on uvicorn in a thread on 127.0.0.1 (an ephemeral port); yields its URL."""
    import uvicorn
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                           access_log=False, timeout_keep_alive=75))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def post_chunked(base: str, path: str, body: bytes, headers: dict, chunk: int = 64 * 1024,
                 method: str = "POST") -> int:
    """Sends ``body`` with ``Transfer-Encoding: chunked`` (no Content-Length); returns the
    response's status. Sending stops early if the server answers and closes meanwhile."""
    url = urllib.parse.urlsplit(base)
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection((url.hostname, url.port), timeout=120) as s:
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: {url.netloc}\r\n{head}"
                  "Transfer-Encoding: chunked\r\n\r\n".encode())
        try:
            for i in range(0, len(body), chunk):
                part = body[i:i + chunk]
                s.sendall(b"%x\r\n%s\r\n" % (len(part), part))
            s.sendall(b"0\r\n\r\n")
        except OSError:  # the server answered (413) and closed before the body ended
            pass
        status_line = s.makefile("rb").readline()
    return int(status_line.split()[1])

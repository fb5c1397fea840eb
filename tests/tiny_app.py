"""The real app (`server.make_app`: the page, the API, /health) over the tiny service, served by uvicorn on a
thread of the test process: seconds to start, where `app_url` (vLLM) takes minutes.

    with served(make_app(tiny_service, Config.of(...)), "127.0.0.1") as url:
        ...

The address must be loopback or one on a network namespace the test made (never another).
"""

from __future__ import annotations

import contextlib
import threading
import time


@contextlib.contextmanager
def served(app, host: str = "127.0.0.1", port: int = 0):
    """`app` (ASGI) listening on host:port (0: a free port) until the block ends; yields its URL."""
    import uvicorn

    from lensapp import shell

    sock = shell.listen(host, port)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="tiny-app", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the tiny app did not start")
        time.sleep(0.05)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}/"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()

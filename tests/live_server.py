"""A Starlette app served by uvicorn in a thread on 127.0.0.1 (a port the system picks), for the
tests that drive a live server; bounded in time to start and to stop."""
import contextlib
import threading
import time

TIMEOUT = 60


@contextlib.contextmanager
def live(app):  # -> the base URL, http://127.0.0.1:PORT
    import uvicorn
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + TIMEOUT
    while not srv.started:
        assert time.time() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{srv.servers[0].sockets[0].getsockname()[1]}"
    finally:
        srv.should_exit = True
        thread.join(TIMEOUT)

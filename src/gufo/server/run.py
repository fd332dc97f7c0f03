"""The app under uvicorn: the listening socket, gufo's header timeout and its graceful shutdown.

Shutdown (SIGTERM or Ctrl-C): new requests get 503 and running ones go on for `shutdown_timeout`;
then each still running ends with an error (an error event and [DONE] in a stream, a JSON 503
otherwise) and the process exits.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from types import FrameType

import uvicorn

from gufo.engine.engine import Engine
from gufo.errors import BadInputError, GufoError
from gufo.server.gate import TimedH11Protocol
from gufo.server.routes import create_app
from gufo.server.settings import ServerSettings
from gufo.server.state import ServerState

SHUTDOWN_FLUSH_SECONDS = 5


def listen(host: str, port: int) -> socket.socket:
    """Bind before serving, so a busy port is one clear error and port 0 picks a free one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        # the address is the user's choice, like any other flag: bad input, exit 2
        raise BadInputError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.listen(2048)  # connections made before uvicorn starts wait in the backlog
    return sock


class GufoServer(uvicorn.Server):
    """uvicorn's server whose first exit signal starts gufo's graceful shutdown (see the module doc)."""

    def __init__(self, config: uvicorn.Config, state: ServerState):
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            self.state.begin_shutdown()
        super().handle_exit(sig, frame)


def make_server(
    settings: ServerSettings,
    load: Callable[[], Engine],
    on_loaded: Callable[[Exception | None], None] | None = None,
    log_level: str | None = None,
) -> GufoServer:
    """The uvicorn server of `create_app`, with gufo's timeouts and shutdown."""
    app = create_app(settings, load, on_loaded)
    protocol = type("TimedH11Protocol", (TimedH11Protocol,), {"header_timeout": settings.header_timeout})
    config = uvicorn.Config(
        app,
        http=protocol,
        log_level=log_level,
        # Running requests end by themselves at the shutdown timeout; the margin lets their error
        # events and [DONE] reach the clients before uvicorn cancels what is left.
        timeout_graceful_shutdown=settings.shutdown_timeout + SHUTDOWN_FLUSH_SECONDS,
    )
    return GufoServer(config, app.state.gufo)


def serve(
    settings: ServerSettings,
    load: Callable[[], Engine],
    sock: socket.socket,
    on_ready: Callable[[], None] | None = None,
    log_level: str | None = None,
) -> None:
    """Serve until interrupted; `on_ready` hears when the model has loaded, and a model that fails to
    load stops the server and raises here. `log_level`: uvicorn's (None: its default, info)."""
    failures: list[Exception] = []

    def loaded(err: Exception | None) -> None:
        if err is None:
            if on_ready is not None:
                on_ready()
            return
        failures.append(err)
        server.should_exit = True

    server = make_server(settings, load, loaded, log_level)
    server.run(sockets=[sock])
    if failures:
        err = failures[0]
        raise err if isinstance(err, GufoError) else GufoError(f"loading the model failed: {err}")

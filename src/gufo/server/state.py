"""The server's state: the engine and scheduler once loaded, readiness and graceful shutdown.

The model loads on a background thread after the server starts listening, so /health and the
generation endpoints answer 503 (with an OpenAI error body) until it is ready, and again once the
generation worker has stopped or a shutdown has begun. Once a shutdown has begun, running requests
go on for `shutdown_timeout` seconds; then the scheduler ends each still running with a 503.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import cached_property

from gufo.engine.constraint import GrammarCompiler
from gufo.engine.engine import Engine
from gufo.engine.speculative import make_speculators
from gufo.errors import GufoError
from gufo.server.metrics import Metrics
from gufo.server.responses import ApiError
from gufo.server.scheduler import Scheduler
from gufo.server.settings import ServerSettings

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """What exists once the model has loaded."""

    engine: Engine
    scheduler: Scheduler

    @cached_property
    def grammars(self) -> GrammarCompiler:
        """Built on the first constrained request (reading the vocabulary takes a fraction of a second)."""
        return GrammarCompiler(self.engine.tokenizer)


@dataclass
class ServerState:
    settings: ServerSettings
    metrics: Metrics = field(default_factory=Metrics)
    runtime: Runtime | None = None
    load_error: str | None = None
    shutting_down: bool = False
    started: int = field(default_factory=lambda: int(time.time()))

    def ready(self) -> Runtime:
        if self.shutting_down:
            raise ApiError(503, "the server is shutting down", "unavailable_error", code="shutting_down")
        if self.runtime is not None:
            if not self.runtime.scheduler.alive:
                message = f"the generation worker has stopped: {self.runtime.scheduler.failure}"
                raise ApiError(503, message, "unavailable_error", code="worker_stopped")
            return self.runtime
        if self.load_error is not None:
            raise ApiError(503, f"the model failed to load: {self.load_error}", "unavailable_error")
        raise ApiError(503, "the model is loading", "unavailable_error", code="model_loading")

    @asynccontextmanager
    async def running(
        self, load: Callable[[], Engine], on_loaded: Callable[[Exception | None], None] | None = None
    ) -> AsyncIterator[None]:
        """Load the model on a background thread while the server runs; stop the scheduler after."""
        loader = threading.Thread(target=self._load, args=(load, on_loaded), name="gufo-load", daemon=True)
        loader.start()
        yield
        await asyncio.to_thread(loader.join)
        if self.runtime is not None:
            self.runtime.scheduler.stop()

    def _load(self, load: Callable[[], Engine], on_loaded: Callable[[Exception | None], None] | None) -> None:
        settings = self.settings
        try:
            engine = load()
            speculative = settings.speculative
            speculators = (
                None if speculative is None else make_speculators(engine, speculative, settings.draft_model)
            )
            if speculators is None:  # the batched decode steps' graphs, before the first request
                engine.prepare_rows(engine.cache.n_slots)
            scheduler = Scheduler(
                engine,
                self.metrics,
                settings.max_pending,
                settings.prefill_chunk,
                speculators,
                settings.state_checkpoints,
                settings.prefill_batch,
            )
            # and the prefill chunks' and packed passes' (GPUs)
            engine.prepare_prefill(settings.prefill_chunk, scheduler.prefill_batch)
            scheduler.start()
            self.runtime = Runtime(engine, scheduler)
            log.debug("model %s loaded", settings.model_id)
            if on_loaded is not None:
                on_loaded(None)
        except Exception as err:  # reported through /health and the CLI, not as a thread traceback
            # A traceback helps only when the failure is not one the user can act on; one the user can
            # act on is the one line the CLI prints (`serve` raises it), so the log repeats it quietly
            if isinstance(err, GufoError):
                log.debug("loading the model failed: %s", err)
            else:
                log.error("loading the model failed: %s", err, exc_info=True)
            self.load_error = str(err)
            if on_loaded is not None:
                on_loaded(err)

    def begin_shutdown(self) -> None:
        """Refuse new requests now; after `shutdown_timeout` seconds end the running ones with a 503."""
        self.shutting_down = True
        runtime = self.runtime
        if runtime is not None:
            message = "the server shut down (--shutdown-timeout)"
            timer = threading.Timer(self.settings.shutdown_timeout, runtime.scheduler.abort, [message])
            timer.daemon = True
            timer.start()

    def gauges(self) -> dict[str, int]:
        if self.runtime is None:
            return {"gufo_requests_active": 0, "gufo_queue_depth": 0}
        return self.runtime.scheduler.gauges()

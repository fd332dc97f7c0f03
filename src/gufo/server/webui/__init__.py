"""The built-in chat page at / (static HTML and JS shipped in the package; no build step, no CDN).

It talks to /v1/chat/completions like any other client: streamed with fetch, its server-sent events
parsed in the page, stopped with an AbortController.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import HTMLResponse, Response

PAGE_PATHS = ("/", "/webui/chat.js")  # open without the API key: the page asks for it


def register(app: FastAPI) -> None:
    assets = files(__name__)
    page = (assets / "index.html").read_text(encoding="utf-8")
    script = (assets / "chat.js").read_text(encoding="utf-8")

    @app.get("/", include_in_schema=False)
    async def chat_page() -> HTMLResponse:
        return HTMLResponse(page)

    @app.get("/webui/chat.js", include_in_schema=False)
    async def chat_script() -> Response:
        return Response(script, media_type="text/javascript")

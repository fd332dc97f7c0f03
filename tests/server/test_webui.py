"""The chat page at / in a real headless browser: the distribution's Chromium driven by Playwright
(no browser download). The page loads without the server's API key and asks for it; a prompt typed in
streams its greedy reply into the page, the stop button ends the request (the server counts it
cancelled), and the page shows its tokens/s."""

from __future__ import annotations

import shutil

import pytest

from gufo.cli.serve import cors_origins, webui_on
from gufo.engine.sampling import SamplingParams
from gufo.server.settings import ServerSettings
from tests.server.conftest import MODEL, live_server, load_engine, wait_for

CHROMIUM = next((path for name in ("chromium", "chromium-browser") if (path := shutil.which(name))), None)
SYSTEM = "You are a storyteller."
PROMPT = "Tell me a long story about a dragon."
KEY = "page-key"


@pytest.fixture(scope="module")
def server():
    settings = ServerSettings(MODEL, max_tokens=256, webui=True, api_key=KEY)
    with live_server(settings, lambda: load_engine(1)) as live:
        yield live


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("no chromium binary on PATH (Debian: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as playwright:
        # --no-sandbox: CI runs as root, where Chromium's sandbox refuses to start
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield browser
        browser.close()


def greedy_reply(engine, max_tokens: int) -> str:
    tok = engine.tokenizer
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}]
    prompt_ids = tok.encode(tok.apply_chat_template(messages), add_special=True, parse_special=True)
    ids = engine.generate(prompt_ids, max_tokens, SamplingParams(temperature=0)).generated_ids
    return tok.decode([t for t in ids if t not in tok.eog_ids])


def test_type_stream_and_stop(server, browser, reference_engine, tmp_path):
    page = browser.new_page()
    page.goto(server.base_url + "/")
    model = page.get_by_test_id("model")
    wait_for(lambda: "API key" in (model.text_content() or ""))  # the page loaded; the API needs the key
    page.locator("#api-key").fill(KEY)
    page.locator("#api-key").press("Tab")
    wait_for(lambda: model.text_content() == MODEL)
    page.get_by_test_id("system").fill(SYSTEM)
    page.locator("#temperature").fill("0")
    page.locator("#max-tokens").fill("200")
    cancelled = server.metric_labelled("cancelled")
    page.get_by_test_id("prompt").fill(PROMPT)
    page.get_by_test_id("prompt").press("Enter")

    user = page.locator(".message.user")
    reply = page.locator(".message.assistant")
    wait_for(lambda: user.count() == 1 and user.text_content() == PROMPT)
    wait_for(lambda: len(reply.text_content() or "") >= 20)  # streamed text has appeared...
    assert page.get_by_test_id("stop").is_enabled()  # ...while the request still runs
    page.get_by_test_id("stop").click()
    status = page.get_by_test_id("status")
    wait_for(lambda: (status.text_content() or "").startswith("stopped"))
    assert "tokens/s" in status.text_content()
    assert page.get_by_test_id("send").is_enabled() and not page.get_by_test_id("stop").is_enabled()
    wait_for(lambda: server.metric_labelled("cancelled") == cancelled + 1)  # the server ended the job
    page.screenshot(path=str(tmp_path / "chat-page.png"))

    shown = reply.text_content()
    assert reply.count() == 1 and len(shown) >= 20
    # the greedy reply's start, a few tokens past what was shown (fewer tokens than characters)
    expected = greedy_reply(reference_engine, len(shown) + 4)
    assert expected.startswith(shown)
    page.close()


def test_webui_default_follows_the_host():
    assert webui_on("127.0.0.1", None) and webui_on("localhost", None)
    assert not webui_on("0.0.0.0", None) and not webui_on("127.0.0.1", False) and webui_on("0.0.0.0", True)
    assert cors_origins(" http://a.test, *,") == ("http://a.test", "*") and cors_origins(None) == ()

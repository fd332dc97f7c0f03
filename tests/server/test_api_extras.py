"""/v1/embeddings, /tokenize and /detokenize, /v1/models/ID, several prompts in /v1/completions,
max_completion_tokens and CORS, on one real server; the oracles are llama.cpp's goldens (token ids,
final logits) and the GGUF read with the `gguf` package."""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import gguf
import numpy as np
import pytest

from gufo.engine.sampling import SamplingParams
from gufo.gguf.aliases import resolve_model
from gufo.server.settings import ServerSettings
from tests.conftest import GOLDENS, MODELS, gguf_reader, golden
from tests.server.conftest import MODEL, assert_error, live_server, load_engine

ORIGIN = "http://page.test"
PROMPTS = golden(MODEL)["prompts"]


@pytest.fixture(scope="module")
def settings() -> ServerSettings:
    return ServerSettings(MODEL, max_tokens=8, cors_origins=(ORIGIN,))


@pytest.fixture(scope="module")
def server(settings):
    with live_server(settings, lambda: load_engine(2)) as live:
        yield live


@pytest.fixture(scope="module")
def reader() -> gguf.GGUFReader:
    return gguf_reader(resolve_model(MODEL))


def unit_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def embedding(server, **body) -> list:
    status, answer = server.request("POST", "/v1/embeddings", body)
    assert status == 200, answer
    return [item["embedding"] for item in answer["data"]]


def test_same_text_same_embedding_at_every_batch_position(server, reader):
    n_embd = int(reader.fields["llama.embedding_length"].contents())
    client = server.client()  # the SDK asks for base64 and decodes it itself
    text = PROMPTS[1]
    alone = client.embeddings.create(model=MODEL, input=text["prompt"])
    batch = client.embeddings.create(
        model=MODEL, input=[text["prompt"], PROMPTS[0]["prompt"], text["prompt"]]
    )
    assert [item.index for item in batch.data] == [0, 1, 2]
    vectors = [np.array(item.embedding, dtype=np.float64) for item in [alone.data[0], *batch.data]]
    assert all(v.shape == (n_embd,) for v in vectors)
    for vector in vectors:
        assert abs(np.linalg.norm(vector) - 1.0) < 1e-5  # unit length, as llama-server's and OpenAI's
    assert abs(unit_cosine(vectors[0], vectors[1]) - 1.0) < 1e-6
    assert abs(unit_cosine(vectors[0], vectors[3]) - 1.0) < 1e-6
    assert unit_cosine(vectors[0], vectors[2]) < 0.999  # a different text is not the same vector
    assert alone.usage.prompt_tokens == text["n_prompt_tokens"]
    assert batch.usage.prompt_tokens == 2 * text["n_prompt_tokens"] + PROMPTS[0]["n_prompt_tokens"]


def test_base64_decodes_to_the_float_list(server):
    prompt = PROMPTS[0]
    floats = embedding(server, input=prompt["prompt"], encoding_format="float")[0]
    encoded = embedding(server, input=prompt["prompt"], encoding_format="base64")[0]
    decoded = np.frombuffer(base64.b64decode(encoded), dtype="<f4")  # as the OpenAI SDK decodes it
    assert decoded.tolist() == floats
    status, answer = server.request("POST", "/v1/embeddings", {"input": prompt["prompt_ids"]})
    assert answer["data"][0]["embedding"] == floats  # token ids embed as their text does
    assert answer["usage"] == {
        "prompt_tokens": prompt["n_prompt_tokens"],
        "total_tokens": prompt["n_prompt_tokens"],
    }


@contextmanager
def pooling(settings: ServerSettings, kind: str) -> Iterator[None]:
    """The server's --pooling for a while (its app reads the settings per request)."""
    settings.pooling = kind
    try:
        yield
    finally:
        settings.pooling = "mean"


def test_last_pooling_projects_onto_llama_cpp_final_logits(server, settings, reader):
    """The last token's output-norm values times the output matrix are its logits: on the 20 tokens
    llama.cpp ranks highest they follow its final logits up to the norm we divided out."""
    code = next(p for p in PROMPTS if p["id"] == "code_py")
    with pooling(settings, "last"):
        vector = np.array(embedding(server, input=code["prompt_ids"])[0])
    logits = np.load(GOLDENS / f"{MODELS[MODEL]}-final-logits-code_py.npy")
    top = np.argsort(-logits)[:20]
    tensors = {t.name: t for t in reader.tensors}
    names = [n for n in ("output.weight", "token_embd.weight") if n in tensors]  # tied when no output
    rows = tensors[names[0]]
    projected = gguf.quants.dequantize(rows.data[top], rows.tensor_type) @ vector
    assert np.corrcoef(projected, logits[top])[0, 1] > 0.99
    assert int(np.argmax(projected)) == 0  # llama.cpp's top token is ours too


def test_one_token_mean_equals_last(server, settings):
    one, several = PROMPTS[0]["prompt_ids"][:1], PROMPTS[0]["prompt_ids"]
    with pooling(settings, "last"):
        last_of_one, last_of_several = embedding(server, input=[one, several])
    mean_of_one, mean_of_several = embedding(server, input=[one, several])
    assert np.abs(np.array(mean_of_one) - np.array(last_of_one)).max() < 1e-6
    assert unit_cosine(np.array(mean_of_several), np.array(last_of_several)) < 0.999


@pytest.mark.parametrize("prompt", PROMPTS, ids=[p["id"] for p in PROMPTS])
def test_tokenize_and_detokenize_match_llama_cpp(server, prompt):
    # the goldens tokenized with add_special=true and parse_special=false
    body = {"content": prompt["prompt"], "add_special": True, "parse_special": False}
    assert server.request("POST", "/tokenize", body) == (200, {"tokens": prompt["prompt_ids"]})
    status, answer = server.request("POST", "/tokenize", {**body, "with_pieces": True})
    assert [item["id"] for item in answer["tokens"]] == prompt["prompt_ids"]
    pieces = [item["piece"] for item in answer["tokens"]]
    joined = b"".join(p.encode() if isinstance(p, str) else bytes(p) for p in pieces)
    assert joined.decode() == prompt["prompt"]
    status, answer = server.request("POST", "/detokenize", {"tokens": prompt["prompt_ids"]})
    assert (status, answer) == (200, {"content": prompt["prompt"]})


def test_model_by_id(server):
    status, answer = server.request("GET", f"/v1/models/{MODEL}")
    assert status == 200 and answer["id"] == MODEL and answer["object"] == "model"
    assert server.client().models.retrieve(MODEL).id == MODEL
    error = assert_error(*server.request("GET", "/v1/models/gpt-4"), 404, "model_not_found")
    assert error["param"] == "model" and "gpt-4" in error["message"]


def greedy_text(engine, prompt_ids: list[int], max_tokens: int) -> str:
    ids = engine.generate(prompt_ids, max_tokens, SamplingParams(temperature=0)).generated_ids
    return engine.tokenizer.decode([t for t in ids if t not in engine.tokenizer.eog_ids])


def test_several_prompts_one_choice_each(server, reference_engine):
    prompts = PROMPTS[:3]
    expected = [greedy_text(reference_engine, p["prompt_ids"], 4) for p in prompts]
    client = server.client()
    request = {"model": MODEL, "max_tokens": 4, "temperature": 0, "extra_body": {"cache_prompt": False}}
    reply = client.completions.create(prompt=[p["prompt"] for p in prompts], **request)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.text for c in reply.choices] == expected
    assert reply.usage.prompt_tokens == sum(p["n_prompt_tokens"] for p in prompts)
    stream = client.completions.create(
        prompt=[p["prompt_ids"] for p in prompts],
        stream=True,
        stream_options={"include_usage": True},
        **request,
    )
    texts = ["", "", ""]
    usage = None
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
        usage = chunk.usage or usage
    assert texts == expected
    assert usage.prompt_tokens == sum(p["n_prompt_tokens"] for p in prompts)


def test_max_completion_tokens_limits_the_chat(server):
    # greedy: sampled at the default temperature, an end-of-generation among the first tokens (rare, but
    # seen in CI) ends the reply with "stop" before the limit
    reply = server.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to twenty."}],
        max_completion_tokens=3,
        temperature=0,
    )
    assert reply.usage.completion_tokens == 3 and reply.choices[0].finish_reason == "length"


def test_cors_for_the_allowed_origin_only(server):
    preflight = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    status, _ = server.request("OPTIONS", "/v1/embeddings", headers=preflight)
    assert status == 200
    request = urllib.request.Request(server.base_url + "/v1/models", headers={"Origin": ORIGIN})
    with urllib.request.urlopen(request) as response:
        assert response.headers["Access-Control-Allow-Origin"] == ORIGIN
    other = urllib.request.Request(server.base_url + "/v1/models", headers={"Origin": "http://evil.test"})
    with urllib.request.urlopen(other) as response:
        assert response.headers["Access-Control-Allow-Origin"] is None
    status, _ = server.request(
        "OPTIONS", "/v1/embeddings", headers={**preflight, "Origin": "http://evil.test"}
    )
    assert status == 400


def test_no_chat_page_unless_asked(server):
    assert_error(*server.request("GET", "/"), 404, "not_found")


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/embeddings", {}, "input"),
        ("/v1/embeddings", {"input": []}, "input"),
        ("/v1/embeddings", {"input": ""}, "input"),
        ("/v1/embeddings", {"input": ["a", ""]}, "input.1"),
        ("/v1/embeddings", {"input": [[1, 2], [49152]]}, "input.1"),
        ("/v1/embeddings", {"input": [5, -1]}, "input"),
        ("/v1/embeddings", {"input": "word " * 600}, "input"),
        ("/v1/embeddings", {"input": "a", "encoding_format": "int8"}, "encoding_format"),
        ("/v1/embeddings", {"input": "a", "dimensions": 3}, "dimensions"),
        ("/v1/embeddings", {"input": "a", "pooling": "cls"}, "pooling"),
        ("/v1/embeddings", {"input": 5}, "input"),
        ("/tokenize", {}, "content"),
        ("/tokenize", {"content": 5}, "content"),
        ("/tokenize", {"content": "a", "add_special": "yes"}, "add_special"),
        ("/detokenize", {"tokens": "abc"}, "tokens"),
        ("/detokenize", {"tokens": [1, 49152]}, "tokens"),
        ("/v1/completions", {"prompt": ["fine", ""]}, "prompt.1"),
        ("/v1/completions", {"prompt": [[1, 2], [-3]]}, "prompt.1"),
        ("/v1/completions", {"prompt": ["ok", "word " * 600]}, "prompt.1"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0},
            "max_completion_tokens",
        ),
    ],
)
def test_bad_input_names_the_param(server, path, body, param):
    error = assert_error(*server.request("POST", path, json.dumps(body).encode()), 400)
    assert error["param"] == param, error
    assert error["type"] == "invalid_request_error"


def test_embeddings_of_an_unknown_model_404(server):
    error = assert_error(*server.request("POST", "/v1/embeddings", {"model": "x", "input": "a"}), 404)
    assert error["param"] == "model" and error["code"] == "model_not_found"


def test_embedding_leaves_the_sessions_kv_alone(server, reference_engine):
    """An embedding between two equal requests: the second reuses the first's cached prompt and still
    gives the greedy text (an embedding written into that slot would change it)."""
    prompt, other = PROMPTS[2], PROMPTS[1]
    expected = greedy_text(reference_engine, prompt["prompt_ids"], 6)
    client = server.client()
    request = {"model": MODEL, "prompt": prompt["prompt_ids"], "max_tokens": 6, "temperature": 0}
    assert client.completions.create(**request).choices[0].text == expected
    embedding(server, input=[other["prompt_ids"], prompt["prompt_ids"][::-1]])
    again = client.completions.create(**request)
    assert again.choices[0].text == expected
    assert again.usage.prompt_tokens_details.cached_tokens == prompt["n_prompt_tokens"] - 1

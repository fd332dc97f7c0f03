"""`gufo chat` and `gufo run -cnv`: the template refusal and override, the greedy reply against
llama.cpp's goldens, and (through a pseudo-terminal) Ctrl-C, line editing and history."""

from __future__ import annotations

import io
import os
import signal
import sys

import pytest

from tests.conftest import golden, gufo

# renders only the latest user turn, as plain text: the prompt is then a golden prompt as it stands
LAST_TURN_TEMPLATE = "{{ messages[-1]['content'] }}"


def paris() -> str:
    """The golden prompt whose first two greedy tokens (" Paris", ".") lead their runner-up by >= 1.0
    logit in llama.cpp (no correct engine may pick another), and their text."""
    prompt = golden("smollm2-135m")["prompts"][0]
    assert prompt["greedy_ids"][:2] == [7042, 30] and min(prompt["greedy_top1_minus_top2"][:2]) >= 1.0
    assert prompt["greedy_text"].startswith(" Paris.")
    return prompt["prompt"]


def test_a_model_without_chat_template_is_refused_with_a_way_out(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hi\n"))
    code, out, err = gufo(capsys, "chat")  # the default model, gemma3-270m, is a base model
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("gufo: error: gemma-3-270m-q4_k_m.gguf has no chat template")
    assert "-m smollm2-135m" in err and "--chat-template NAME|FILE" in err


def test_an_unknown_template_is_one_line(capsys, tmp_path):
    code, _, err = gufo(capsys, "chat", "-m", "smollm2-135m", "--chat-template", str(tmp_path / "none.jinja"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "not a built-in template (chatml, gemma, llama3) nor a readable file" in err


def test_template_file_renders_the_turn_and_the_reply_is_llamacpp_greedy(capsys, monkeypatch, tmp_path):
    template = tmp_path / "last-turn.jinja"
    template.write_text(LAST_TURN_TEMPLATE)
    monkeypatch.setattr(sys, "stdin", io.StringIO(paris() + "\n"))
    args = ("-m", "smollm2-135m", "--chat-template", str(template), "-n", "2", "--temp", "0")
    code, out, _ = gufo(capsys, "chat", *args)
    assert code == 0
    assert out == " Paris.\n"


@pytest.mark.parametrize("speculative", [None, "ngram"])
def test_ctrl_c_stops_a_reply_and_leaves_the_engine_fit_for_the_next(speculative):
    from gufo.cli.chat import sigint_stops_reply
    from gufo.engine.engine import Engine
    from gufo.engine.sampling import SamplingParams
    from gufo.engine.speculative import SpeculativeParams, make_speculator

    prompt = golden("smollm2-135m")["prompts"][0]
    engine = Engine("smollm2-135m", context=256)
    generator = make_speculator(engine, SpeculativeParams(speculative)) if speculative else engine
    greedy = SamplingParams(temperature=0.0)
    seen: list[int] = []

    def press_ctrl_c_at_the_third(token: int) -> None:
        seen.append(token)
        if len(seen) == 3:
            os.kill(os.getpid(), signal.SIGINT)

    with sigint_stops_reply() as stop_requested:
        stopped = generator.generate(
            prompt["prompt_ids"], 32, greedy, on_token=press_ctrl_c_at_the_third, should_stop=stop_requested
        )
    assert stopped.stopped_by == "interrupted" and stopped.generated_ids == seen
    assert 3 <= len(seen) < 32
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the session's Ctrl-C again
    # the next turn on the same slot: llama.cpp's greedy tokens, as far as they are unambiguous
    robust = next(i for i, m in enumerate(prompt["greedy_top1_minus_top2"]) if m < 1.0)
    again = generator.generate(prompt["prompt_ids"], robust, greedy)
    assert again.generated_ids == prompt["greedy_ids"][:robust]

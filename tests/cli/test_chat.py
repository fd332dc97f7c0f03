"""`gufo chat` and `gufo run -cnv`: the template refusal and override, the greedy reply against
llama.cpp's goldens, and (through a pseudo-terminal) Ctrl-C, line editing and history."""

from __future__ import annotations

import io
import os
import re
import signal
import sys

import pytest

from gufo.cli.chat import PROMPT
from tests.conftest import DEVICE, HANG_GUARD_S, REPO, golden, gufo

# the conversation as plain text, the contents one after the other
CONTENTS_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


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


@pytest.mark.parametrize("cache", [True, False], ids=["cache-prompt", "no-cache-prompt"])
def test_turns_history_and_clear_with_a_template_file(capsys, monkeypatch, tmp_path, cache):
    """Each turn renders the whole conversation (with a template of the contents one after the other:
    the prompt is a golden prompt as it stands), the reply is llama.cpp's greedy one, and /clear forgets.
    By default the second turn prefills only past the first turn and the reply's fed token, which the
    slot kept; with --no-cache-prompt it prefills everything, and the replies are the same."""
    template = tmp_path / "contents.jinja"
    template.write_text(CONTENTS_TEMPLATE)
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{paris()}\nHello\n/clear\n\nBye\n/exit\nnever read\n"))
    args = (
        "-m",
        "smollm2-135m",
        "--chat-template",
        str(template),
        "-n",
        "2",
        "--temp",
        "0",
        "--verbose-prompt",
        *(() if cache else ("--no-cache-prompt",)),
    )
    code, out, err = gufo(capsys, "chat", *args)
    assert code == 0
    assert out.startswith(" Paris.\n")
    prompts = [line for line in err.splitlines() if not line.startswith("[ ")]
    assert prompts == [paris(), paris() + " Paris.Hello", "conversation cleared", "Bye"]
    timings = [line for line in err.splitlines() if line.startswith("[ ")]
    n_prompt = len(golden("smollm2-135m")["prompts"][0]["prompt_ids"])
    assert (
        timings[0].startswith(f"[ Prompt: {n_prompt} tokens, ") and "| Generation: 2 tokens, " in timings[0]
    )
    assert len(timings) == 3  # three replies: the empty line is skipped, nothing read after /exit
    # the second turn's tokens start with the first turn's and " Paris" (the reply's last token, ".", was
    # never fed); the third follows /clear and shares nothing
    cached = [re.search(r"tokens \((\d+) cached\)", line) for line in timings]
    if cache:
        assert cached[0] is None and cached[2] is None
        assert cached[1] is not None and int(cached[1].group(1)) == n_prompt + 1
    else:
        assert cached == [None, None, None]


def test_run_cnv_takes_the_system_prompt_then_p_as_the_first_turn(capsys, monkeypatch, tmp_path):
    """-sys then -p render as the golden prompt; a turn that overflows the context (-c 8: the golden
    prompt's 5 tokens and the 2 of the reply leave one) is refused in a line, and the session goes on."""
    template = tmp_path / "contents.jinja"
    template.write_text(CONTENTS_TEMPLATE)
    monkeypatch.setattr(sys, "stdin", io.StringIO("and what is the capital of Italy?\n"))
    system, turn = paris().rsplit(" ", 1)  # "The capital of France", "is"
    args = ("-m", "smollm2-135m", "--chat-template", str(template), "-n", "2", "--temp", "0", "-c", "8")
    code, out, err = gufo(capsys, "run", *args, "-cnv", "-sys", system + " ", "-p", turn, "--no-show-timings")
    assert code == 0 and out == " Paris.\n"
    assert err.startswith("gufo: the conversation of ") and err.count("\n") == 1
    assert " tokens fills the context size 8: /clear starts over" in err


@pytest.mark.parametrize(
    "args,line",
    [
        (["-sys", "Be brief.", "-p", "Hi"], "gufo: error: -sys: only with -cnv"),
        (["-i", "--ignore-eos", "--verbose"], "gufo: error: --ignore-eos, --verbose: only without -cnv"),
        ([], "gufo: error: one of -p/--prompt and -f/--file is required (or -cnv for a conversation)"),
    ],
)
def test_run_refuses_the_other_modes_flags(capsys, args, line):
    code, out, err = gufo(capsys, "run", "-m", "smollm2-135m", *args)
    assert (code, out, err) == (2, "", line + "\n")


@pytest.fixture(scope="module")
def engine():
    from gufo.engine.engine import Engine
    from gufo.options import RunOptions

    return Engine("smollm2-135m", options=RunOptions(device=DEVICE), context=256)  # GPUs: graph replays


@pytest.mark.parametrize("speculative", [None, "ngram"])
def test_ctrl_c_stops_a_reply_and_leaves_the_engine_fit_for_the_next(engine, speculative):
    from gufo.cli.chat import sigint_stops_reply
    from gufo.engine.sampling import SamplingParams
    from gufo.engine.speculative import SpeculativeParams, make_speculator

    prompt = golden("smollm2-135m")["prompts"][0]
    generator = make_speculator(engine, SpeculativeParams(speculative)) if speculative else engine
    greedy = SamplingParams(temperature=0.0)
    seen: list[int] = []

    session_handler = signal.getsignal(signal.SIGINT)  # a pytest-xdist worker ignores SIGINT
    with sigint_stops_reply() as stop_requested:

        def press_ctrl_c_at_the_third(token: int) -> bool:
            seen.append(token)
            if len(seen) == 3:
                os.kill(os.getpid(), signal.SIGINT)
            return stop_requested()  # as the chat's printer answers

        stopped = generator.generate(prompt["prompt_ids"], 32, greedy, on_token=press_ctrl_c_at_the_third)
    # the handler has run before the callback asks, right after the token it came in
    assert stopped.stopped_by == "stop" and stopped.generated_ids == seen and len(seen) == 3
    assert signal.getsignal(signal.SIGINT) is session_handler  # the session's Ctrl-C again
    # the next turn on the same slot: llama.cpp's greedy tokens, as far as they are unambiguous
    robust = next(i for i, m in enumerate(prompt["greedy_top1_minus_top2"]) if m < 1.0)
    again = generator.generate(prompt["prompt_ids"], robust, greedy)
    assert again.generated_ids == prompt["greedy_ids"][:robust]


def test_terminal_session_ctrl_c_history_and_ctrl_d():
    """Acceptance: `gufo chat -m smollm2-135m` on a pseudo-terminal. Two turns; Ctrl-C in the middle of
    the second reply stops it and the prompt returns; the up arrow recalls the last line (readline, not
    a literal ^[[A); Ctrl-D on the emptied line ends the session with a newline and exit 0."""
    import pexpect

    budget = 48  # tokens per reply: a long story takes all of them unless Ctrl-C stops it
    env = dict(os.environ, TERM="dumb", PYTHONPATH=str(REPO / "src"))
    command = ["-m", "gufo.cli.main", "chat", "-m", "smollm2-135m", "--temp", "0", "-t", "1"]
    command += ["-n", str(budget)]
    child = pexpect.spawn(sys.executable, command, env=env, encoding="utf-8", timeout=HANG_GUARD_S)
    seen = io.StringIO()
    child.logfile_read = seen

    def turn(line: str) -> None:
        child.expect_exact(PROMPT)
        child.sendline(line)
        child.expect_exact(line + "\r\n")

    def generated() -> int:
        child.expect(r"\| Generation: (\d+) tokens")
        return int(child.match.group(1))

    child.expect_exact("Ctrl-C during a reply stops it")  # the keys are explained on a terminal
    turn("Hi")
    generated()
    reply, timings = child.before.split("[ Prompt: ")
    assert re.search(r"\w", reply) and int(timings.split()[0]) > len("Hi")  # the template's tokens too
    story = "Tell me a long story about a dragon."
    turn(story)
    child.expect(r"\w+ \w+")  # the reply is streaming
    child.sendintr()
    assert generated() < budget
    assert "^C" in child.before
    child.expect_exact(PROMPT)  # back at the prompt, the session goes on
    child.send("\x1b[A")  # up arrow
    child.expect_exact(story)
    child.send("\x15")  # Ctrl-U: readline empties the line
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, seen.getvalue()
    assert seen.getvalue().endswith("\r\n") and "^[[" not in seen.getvalue()

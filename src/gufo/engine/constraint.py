"""Constrained decoding: a grammar (a JSON schema, any JSON object, a client's GBNF or Lark, or an EBNF
wrapper around one) as a token mask applied before sampling, with xgrammar (docs/decisions.md says why not
llguidance).

`GrammarCompiler` belongs to one tokenizer (its vocabulary's token bytes, built once); each request gets
its own `TokenConstraint`, a matcher that holds that request's parse state, so rows of a batch are
masked independently. Control tokens are never allowed inside the grammar; end-of-generation tokens
only where the grammar may end.
"""

from __future__ import annotations

import json
import re
import threading
from typing import TYPE_CHECKING, Any

import torch

from gufo.engine.json_closing import BudgetTable, ReplyBudget
from gufo.errors import BadInputError
from gufo.tokenizer import Tokenizer

if TYPE_CHECKING:
    import xgrammar

# xgrammar is imported where a grammar is first built, not with this module: it imports transformers,
# about 2 CPU seconds in every engine process (each CLI run, server and torchrun rank), most of which
# never constrain a reply.

# JSON Schema keywords xgrammar does not enforce: a schema using them would not be guaranteed.
UNENFORCED_KEYWORDS = frozenset(
    {"not", "if", "then", "else", "dependentSchemas", "uniqueItems", "contains", "minContains",
     "maxContains", "unevaluatedItems", "$dynamicRef", "$dynamicAnchor"}
)  # fmt: skip


def unenforced_keyword(schema: Any, path: str = "") -> str | None:
    """The JSON path of the first keyword in `schema` that the grammar cannot enforce, or None."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in UNENFORCED_KEYWORDS:
                return f"{path}/{key}"
            # Below these the keys are property names, not keywords.
            if key in ("properties", "patternProperties", "$defs", "definitions") and isinstance(value, dict):
                for name, sub in value.items():
                    found = unenforced_keyword(sub, f"{path}/{key}/{name}")
                    if found:
                        return found
            elif key not in ("enum", "const", "default", "examples"):
                found = unenforced_keyword(value, f"{path}/{key}")
                if found:
                    return found
    elif isinstance(schema, list):
        for index, item in enumerate(schema):
            found = unenforced_keyword(item, f"{path}/{index}")
            if found:
                return found
    return None


# OpenAI's json_object: any JSON object (xgrammar's built-in JSON grammar would allow any value), on one
# line with the separators json_schema output has, its numbers ones a double holds (JSON parsers read
# numbers as IEEE doubles; I-JSON, RFC 7493, asks for no more): at most DBL_DIG = 15 digits in all, so
# every integer is exact and every decimal survives the round trip, and an exponent of at most 2 digits,
# so none overflows or underflows. Unbounded, a small model can write one number until max_tokens
# (smollm2, asked for 40 decimals of pi). json_schema keeps xgrammar's schema semantics, unbounded.
# Strings are right-recursive, as xgrammar's own JSON grammar writes them: as `char*` then the closing
# quote, with the \u escape among the chars, a mask over Qwen's 151936 tokens took 12x as long
# (docs/decisions.md, "Server: structured output and tool calls through xgrammar"). A char is no UTF-8
# encoded surrogate (U+D800-DFFF): xgrammar's classes take them, and no UTF-8 decoder reads them back.
NUMBER_DIGITS, EXPONENT_DIGITS = 15, 2


def json_number_rule() -> str:
    """`number`, its digits counted across the point: a leading "0", or 1-9 and k more digits, then a
    fraction of the digits left."""
    mantissas = [f'"0" ("." [0-9]{{1,{NUMBER_DIGITS - 1}}})?']
    for more in range(NUMBER_DIGITS):
        left = NUMBER_DIGITS - 1 - more
        integer = f"[1-9] [0-9]{{{more}}}" if more else "[1-9]"
        mantissas.append(integer + (f' ("." [0-9]{{1,{left}}})?' if left else ""))
    return f'number ::= "-"? ({" | ".join(mantissas)}) ([eE] [+-]? [0-9]{{1,{EXPONENT_DIGITS}}})?\n'


JSON_OBJECT = r"""root ::= object
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" "}" | "{" member (", " member)* "}"
member ::= string ": " value
array ::= "[" "]" | "[" value (", " value)* "]"
string ::= "\"" characters
characters ::= "\"" | char characters
char ::= [^"\\\0-\x1f\ud800-\udfff] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])
""" + json_number_rule()


class GrammarCompiler:
    """Compiles grammars for one tokenizer's vocabulary; thread-safe (xgrammar's compiler is)."""

    def __init__(self, tokenizer: Tokenizer):
        import xgrammar

        self.vocab_size = tokenizer.vocab_size
        pieces = [
            b"" if tokenizer.is_special(i) else tokenizer.token_bytes(i) for i in range(self.vocab_size)
        ]
        info = xgrammar.TokenizerInfo(
            pieces,
            xgrammar.VocabType.RAW,
            vocab_size=self.vocab_size,
            stop_token_ids=sorted(tokenizer.eog_ids),
        )
        self._compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        self._pieces = pieces
        self._budget_table: BudgetTable | None = None
        self._budget_lock = threading.Lock()

    def budget_table(self) -> BudgetTable:
        """The vocabulary's tables for keeping json_object replies closable (built on first use)."""
        with self._budget_lock:
            if self._budget_table is None:
                self._budget_table = BudgetTable(self._pieces)
            return self._budget_table

    def json_object(self) -> xgrammar.CompiledGrammar:
        """Any JSON object with bounded numbers (OpenAI's json_object mode; `JSON_OBJECT` says why)."""
        import xgrammar

        return self._compiler.compile_grammar(xgrammar.Grammar.from_ebnf(JSON_OBJECT))

    def json_schema(self, schema: dict) -> xgrammar.CompiledGrammar:
        """Raises BadInputError naming a keyword the grammar cannot enforce, or why xgrammar refused it."""
        return self._compiler.compile_grammar(schema_grammar(schema))

    def grammar(self, text: str) -> xgrammar.CompiledGrammar:
        """A client's grammar: GBNF, llama.cpp's EBNF (as llama-server and vLLM take it), starting at its
        rule `root`; or Lark, starting at `start`, when no line defines a rule with `::=` (vLLM's rule for
        telling them apart). Raises BadInputError saying where it is wrong."""
        import xgrammar

        lark = not any("::=" in line for line in text.splitlines())
        try:
            grammar = xgrammar.Grammar.from_lark(text) if lark else xgrammar.Grammar.from_ebnf(text)
        except (RuntimeError, ValueError, TypeError) as err:
            raise BadInputError(
                f"invalid {'Lark' if lark else 'GBNF'} grammar: {xgrammar_reason(err)}"
            ) from None
        return self._compiler.compile_grammar(grammar)

    def tool_calls(self, functions: dict[str, dict], before: str, after: str) -> xgrammar.CompiledGrammar:
        """One call of one of `functions` (name -> parameters schema):
        `before{"name": NAME, "arguments": ARGUMENTS}after`. Each schema stays a root of its own, so its
        `$ref`s resolve in it."""
        import xgrammar

        calls = [
            xgrammar.Grammar.concat(
                literal(f'{before}{{"name": {json.dumps(name)}, "arguments": '),
                schema_grammar(parameters),
                literal(f"}}{after}"),
            )
            for name, parameters in functions.items()
        ]
        return self._compiler.compile_grammar(xgrammar.Grammar.union(*calls) if len(calls) > 1 else calls[0])


def literal(text: str) -> xgrammar.Grammar:
    import xgrammar

    return xgrammar.Grammar.from_ebnf(f"root ::= {json.dumps(text)}")  # a JSON string is an EBNF literal


def schema_grammar(schema: dict) -> xgrammar.Grammar:
    """Strict (OpenAI's strict mode): properties the schema does not name are not allowed. One-line
    JSON, no free whitespace: a small model sampled hot would otherwise spend its tokens on blank lines."""
    found = unenforced_keyword(schema)
    if found is not None:
        raise BadInputError(f"the schema keyword at {found} is not supported (it cannot be enforced)")
    import xgrammar

    try:
        return xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, strict_mode=True)
    except (RuntimeError, ValueError, TypeError) as err:
        raise BadInputError(f"the schema is not supported: {xgrammar_reason(err)}") from None


def xgrammar_reason(err: Exception) -> str:
    """Why xgrammar refused, on one line: without the timestamp and source location its C++ messages
    start with, and without the caret picture under its Lark messages."""
    text = re.sub(r"^\[[^\]]*\] \S+?:\d+: ", "", str(err).strip())
    return text.splitlines()[0].strip() if text else type(err).__name__


class TokenConstraint:
    """One request's matcher: `mask` the logits before sampling, then `accept` the sampled token;
    speculative decoding also tries drafted tokens (`advance`) and takes them back (`rollback`).
    A json_object constraint gets its vocabulary's `BudgetTable`: once `fit` tells it the reply's token
    budget, its masks also keep the reply closable within that budget (`gufo.engine.json_closing`)."""

    def __init__(
        self, grammar: xgrammar.CompiledGrammar, vocab_size: int, budget_table: BudgetTable | None = None
    ):
        import xgrammar

        self._matcher = xgrammar.GrammarMatcher(grammar)
        self._bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)
        self._filled = False  # the bitmask holds the current state's mask (BatchMasker fills it ahead)
        self._vocab_size = vocab_size
        self._budget_table = budget_table
        self._budget: ReplyBudget | None = None

    def fit(self, tokens: int) -> None:
        """The reply gets at most `tokens` tokens: a json_object reply closes its open strings, arrays and
        objects before they run out (a no-op for other grammars). Call before the first token."""
        if self._budget_table is not None:
            self._budget = ReplyBudget(self._budget_table, tokens)
            self._filled = False

    def narrow(self, bitmask: torch.Tensor) -> None:
        """Clear in `bitmask` [1, words] (filled by the matcher) the tokens the reply's budget forbids."""
        if self._budget is not None:
            self._budget.restrict(bitmask[0].numpy())

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """A copy of the 1-D `logits` with every token the grammar forbids at -inf (on their device)."""
        import xgrammar

        if not self._filled:
            self._matcher.fill_next_token_bitmask(self._bitmask)
            self.narrow(self._bitmask)
            self._filled = True
        masked = logits.float().clone().unsqueeze(0)
        xgrammar.apply_token_bitmask_inplace(
            masked, self._bitmask.to(masked.device, non_blocking=True), vocab_size=self._vocab_size
        )
        return masked[0]

    def accept(self, token: int) -> None:
        if not self._matcher.is_terminated() and not self._take(token):
            raise RuntimeError(f"token {token} breaks the grammar")  # a masked sampler never draws one
        self._filled = False

    def _take(self, token: int) -> bool:
        """Accept `token` where the budget and the grammar both allow it; else leave both as they were."""
        if self._budget is not None and not self._budget.take(token):
            return False
        if self._matcher.accept_token(token):
            return True
        if self._budget is not None:
            self._budget.rollback(1)
        return False

    @property
    def ended(self) -> bool:
        """The grammar's end-of-generation token was accepted: nothing may follow."""
        return self._matcher.is_terminated()

    def advance(self, token: int) -> bool:
        """Accept `token` if the grammar allows it here; False (the state unchanged) if not. Speculation
        checks drafted tokens so, then `rollback`s them."""
        accepted = not self._matcher.is_terminated() and self._take(token)
        self._filled = self._filled and not accepted
        return accepted

    def rollback(self, count: int) -> None:
        """Undo the last `count` accepted tokens (xgrammar keeps the whole history)."""
        if count:
            self._matcher.rollback(count)
            if self._budget is not None:
                self._budget.rollback(count)
            self._filled = False


class BatchMasker:
    """Masks the rows of a batched decode step at once: the grammars' masks filled on xgrammar's threads
    (on the host, while the step still runs on the device), then applied in place in one launch where
    the logits are. Each constraint keeps its filled mask, so a row that its Sampler draws from on the
    host is not filled again."""

    def __init__(self) -> None:
        import xgrammar

        self._matchers = xgrammar.BatchGrammarMatcher()

    def mask_rows(self, logits: torch.Tensor, rows: list[int], constraints: list[TokenConstraint]) -> None:
        """Every token that `constraints[i]` forbids at -inf in row `rows[i]` of `logits` [B, vocab]."""
        import xgrammar

        vocab_size = constraints[0]._vocab_size
        bitmask = xgrammar.allocate_token_bitmask(len(logits), vocab_size)  # row i masks logits row i
        self._matchers.batch_fill_next_token_bitmask([c._matcher for c in constraints], bitmask, rows)
        for row, constraint in zip(rows, constraints, strict=True):
            constraint.narrow(bitmask[row : row + 1])
            constraint._bitmask.copy_(bitmask[row : row + 1])
            constraint._filled = True
        xgrammar.apply_token_bitmask_inplace(
            logits, bitmask.to(logits.device, non_blocking=True), vocab_size=vocab_size, indices=rows
        )

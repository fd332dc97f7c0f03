"""How often a json_object reply closes its object within max_tokens, per grammar variant: gufo's
one-line `JSON_OBJECT`, and two with JSON's structural whitespace bounded (never two line breaks in a
row): llama.cpp's json-schema-to-grammar `space` (`"" | " " | "\n" [ \t]{0,20}` after `{ [ : ,` and
around each value) and a pretty-print one (a line break and up to 20 spaces after `{ [ ,` and before
`} ]`). `free` is the model unconstrained. Greedy and sampled (temperature 1, seeds 1-3), one line of
JSON per reply, then a summary per variant (docs/decisions.md, structured output, has the numbers):

    PYTHONPATH=src:. python scripts/json_object_closing.py gemma3-270m oneline,llama,pretty,free
"""

from __future__ import annotations

import argparse
import json

from gufo.engine.constraint import JSON_OBJECT, GrammarCompiler, TokenConstraint
from gufo.engine.engine import Engine
from gufo.engine.params import SamplingParams
from gufo.options import RunOptions

PROMPTS = [
    "Give two colors and their counts as JSON.",  # the acceptance set's json_object prompt
    "Reply in JSON: the name and age of a fictional person.",
    "Reply in JSON: three fruits and their colors.",
    "Reply in JSON: the capital of France and its population.",
    "Reply in JSON: a book's title, author and year.",
]
SEEDS = (None, 1, 2, 3)  # None: greedy
TAIL = "string ::=" + JSON_OBJECT.split("string ::=", 1)[1]  # strings and bounded numbers, shared
HEAD = 'root ::= object\nvalue ::= object | array | string | number | "true" | "false" | "null"\n'
VARIANTS = {
    "oneline": JSON_OBJECT,
    "llama": HEAD
    + r"""space ::= "" | " " | "\n" [ \t]{0,20}
object ::= "{" space (string space ":" space value space ("," space string space ":" space value space)*)? "}"
array ::= "[" space (value space ("," space value space)*)? "]"
"""
    + TAIL,
    "pretty": HEAD
    + r"""nl ::= "\n" " "{0,20}
object ::= "{" nl? "}" | "{" nl? member ("," (" " | nl) member)* nl? "}"
member ::= string ": " value
array ::= "[" nl? "]" | "[" nl? value ("," (" " | nl) value)* nl? "]"
"""
    + TAIL,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model")
    parser.add_argument("variants", help="comma-separated: " + ",".join([*VARIANTS, "free"]))
    parser.add_argument("--max-tokens", type=int, default=96)  # the acceptance set's
    args = parser.parse_args()
    engine = Engine(args.model, options=RunOptions(threads=1), context=1024)
    tokenizer = engine.tokenizer
    compiler = GrammarCompiler(tokenizer)
    for variant in args.variants.split(","):
        compiled = None if variant == "free" else compiler.grammar(VARIANTS[variant])
        rows = []
        for index, prompt in enumerate(PROMPTS):
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
            ids = tokenizer.encode(text, add_special=True, parse_special=True)
            for seed in SEEDS:
                params = SamplingParams(temperature=0.0 if seed is None else 1.0, seed=seed)
                constraint = None if compiled is None else TokenConstraint(compiled, compiler.vocab_size)
                result = engine.generate(ids, args.max_tokens, params, constraint=constraint)
                reply = tokenizer.decode([t for t in result.generated_ids if t not in tokenizer.eog_ids])
                try:
                    parsed = isinstance(json.loads(reply), dict)
                except ValueError:
                    parsed = False
                closed = result.stopped_by == "eog"
                row = {"variant": variant, "prompt": index, "seed": seed, "closed": closed, "parsed": parsed}
                rows.append({**row, "tokens": len(result.generated_ids), "reply": reply})
                print(json.dumps(rows[-1]), flush=True)
        greedy = [r for r in rows if r["seed"] is None]
        sampled = [r for r in rows if r["seed"] is not None]
        print(
            f"{args.model} {variant}: greedy parsed {sum(r['parsed'] for r in greedy)}/{len(greedy)}, "
            f"sampled parsed {sum(r['parsed'] for r in sampled)}/{len(sampled)}, "
            f"mean tokens {sum(r['tokens'] for r in rows) / len(rows):.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()

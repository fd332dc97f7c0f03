"""A chat request's tools and response format -> its prompt text and its grammar (a token constraint).

`tool_choice` "required" or a named function constrains the reply to one hermes-style call whose
arguments follow the function's parameters schema; `response_format` json_object / json_schema
constrains it to JSON; `grammar` (or `structured_outputs.grammar`) to a client's GBNF or Lark grammar, on
completions too. Every schema is checked first (an invalid one, or one using a keyword the
grammar cannot enforce, is a 400 naming the field).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jsonschema

from gufo.engine.constraint import GrammarCompiler, TokenConstraint, unenforced_keyword
from gufo.errors import BadInputError
from gufo.server.reply import CALL_CLOSE, CALL_OPEN, THINK_OPEN, call_text, describe_tools
from gufo.server.responses import ApiError
from gufo.server.schemas import ChatCompletionRequest, GenerationRequest, NamedToolChoice
from gufo.tokenizer import Tokenizer

if TYPE_CHECKING:
    import xgrammar

ANY_OBJECT: dict[str, Any] = {"type": "object"}
RESERVED_VARIABLES = frozenset({"messages", "tools", "template", "add_generation_prompt"})


def check_schema(schema: dict, param: str) -> None:
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as err:
        where = "/".join(str(part) for part in err.absolute_path)
        raise ApiError(400, f"{param}: invalid JSON schema at /{where}: {err.message}", param=param) from None


def check_tools(body: ChatCompletionRequest) -> None:
    """Each tool's parameters are a valid schema (one the grammar can enforce, when the choice is
    constrained); tool_choice needs tools, and a named one names one of them."""
    constrained = body.tool_choice == "required" or isinstance(body.tool_choice, NamedToolChoice)
    for index, tool in enumerate(body.tools or []):
        param = f"tools.{index}.function.parameters"
        if tool.function.parameters is not None:
            check_schema(tool.function.parameters, param)
        found = unenforced_keyword(tool.function.parameters) if constrained else None
        if found is not None:
            message = f"{param}: the schema keyword at {found} cannot be enforced in a required call"
            raise ApiError(400, message, param=param, code="invalid_value")
    choice = body.tool_choice
    if choice not in (None, "none") and not body.tools:
        raise ApiError(400, "tool_choice: no tools were given to choose from", param="tool_choice")
    if isinstance(choice, NamedToolChoice) and choice.function.name not in (body.tool_names() or ()):
        message = f"tool_choice: no tool named '{choice.function.name}' among the tools given"
        raise ApiError(400, message, param="tool_choice")


def called_functions(body: ChatCompletionRequest) -> dict[str, dict] | None:
    """The functions (name -> parameters schema) a constrained tool_choice lets the one call name; None
    when the model chooses."""
    choice = body.tool_choice
    if choice != "required" and not isinstance(choice, NamedToolChoice):
        return None
    named = choice.function.name if isinstance(choice, NamedToolChoice) else None
    return {
        tool.function.name: tool.function.parameters or ANY_OBJECT
        for tool in body.tools or []
        if named in (None, tool.function.name)
    }


def client_grammar(body: GenerationRequest, compiler: GrammarCompiler) -> xgrammar.CompiledGrammar | None:
    """The request's own grammar (`grammar` or `structured_outputs.grammar`) compiled, or None
    (blocking: compiling takes milliseconds)."""
    found = body.grammar_field()
    if found is None:
        return None
    param, text = found
    try:
        return compiler.grammar(text)
    except BadInputError as err:
        raise ApiError(400, f"{param}: {err}", param=param, code="invalid_value") from None


def constrained_field(body: ChatCompletionRequest) -> str | None:
    """The field whose constraint the reply follows (one at most), or None."""
    found = body.grammar_field()
    fields = [
        *([found[0]] if found is not None else []),
        *(
            ["response_format"]
            if body.response_format is not None and body.response_format.type != "text"
            else []
        ),
        *(["tool_choice"] if called_functions(body) is not None else []),
    ]
    if len(fields) > 1:
        message = f"{fields[0]}: not together with {fields[1]} (each constrains the whole reply)"
        raise ApiError(400, message, param=fields[0], code="invalid_value")
    return fields[0] if fields else None


def constraint_for(body: ChatCompletionRequest, compiler: GrammarCompiler) -> TokenConstraint | None:
    """This request's grammar, or None (blocking: compiling a schema takes tens of milliseconds)."""
    if body.grammar_field() is not None:
        return TokenConstraint(client_grammar(body, compiler), compiler.vocab_size)
    functions = called_functions(body)
    try:
        if functions is not None:
            grammar = compiler.tool_calls(functions, f"{CALL_OPEN}\n", f"\n{CALL_CLOSE}")
        elif body.response_format is None or body.response_format.type == "text":
            return None
        elif body.response_format.type == "json_object":
            return TokenConstraint(compiler.json_object(), compiler.vocab_size, compiler.budget_table())
        else:
            grammar = compiler.json_schema(response_schema(body))
    except BadInputError as err:
        param = "tools" if functions is not None else "response_format"
        raise ApiError(400, f"{param}: {err}", param=param, code="invalid_value") from None
    return TokenConstraint(grammar, compiler.vocab_size)


def response_schema(body: ChatCompletionRequest) -> dict:
    form = body.response_format.json_schema
    if form is None:
        raise ApiError(
            400, "response_format: json_schema is required with type 'json_schema'", param="response_format"
        )
    check_schema(form.schema_, "response_format")
    return form.schema_


def render_prompt(body: ChatCompletionRequest, tokenizer: Tokenizer, template: str | None) -> str:
    """The chat template's text for the request: tools go to the template as `tools=` (as transformers
    passes them); a template that renders no tools gets them described in the system message, and
    earlier calls written into their assistant turns (as llama.cpp's polyfill does)."""
    messages = [m.as_template_input() for m in body.messages]
    variables = dict(body.chat_template_kwargs or {})
    reserved = sorted(RESERVED_VARIABLES & set(variables))
    if reserved:
        message = f"chat_template_kwargs: '{reserved[0]}' is set by the server"
        raise ApiError(400, message, param="chat_template_kwargs")
    offered = body.tool_names() is not None
    source = template or tokenizer.chat_template or ""
    if offered and "tools" in source:
        variables["tools"] = [tool.model_dump(exclude_none=True) for tool in body.tools]
    elif offered:
        description = describe_tools([tool.model_dump(exclude_none=True) for tool in body.tools])
        if messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{description}"}
        else:
            messages.insert(0, {"role": "system", "content": description})
    if offered and "tool_calls" not in source:
        for message in messages:
            calls = message.pop("tool_calls", None)
            if calls:
                written = "\n".join(call_text(call) for call in calls)
                message["content"] = f"{message['content']}\n{written}".strip()
    try:
        return tokenizer.apply_chat_template(messages, template=template, **variables)
    except BadInputError as err:
        raise ApiError(400, str(err), param="messages") from None


def thinks(tokenizer: Tokenizer, template: str | None) -> bool:
    return THINK_OPEN in (template or tokenizer.chat_template or "")

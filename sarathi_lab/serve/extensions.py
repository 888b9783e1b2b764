"""The fields of OpenAI's and vLLM's request bodies this server does not run, accepted where
they leave the result as it is and refused, naming the field, where they would change it.

Load generators send many of them at their neutral values on every request (`vllm bench
serve`: `repetition_penalty: 1.0`, `logprobs: null`; GuideLLM: `stop: null`, ...); refusing those
would refuse the tool, and accepting a value that changes the tokens would serve something other
than what was asked. Each field has a test of "changes nothing" that may read the rest of the
request (`Context`): `top_k: 40` changes nothing under greedy decoding, `min_tokens: 8` nothing
when `ignore_eos` is set and no stop string is given (only `max_tokens` ends such a request).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Context:
    """What of the request a field's test reads."""
    greedy: bool          # temperature 0: the most likely token, whatever the filters keep
    ignore_eos: bool
    stops: bool           # stop strings given
    tokenizer: bool       # the output has text (else `token_id:<id>` pieces)
    vocab_size: int
    max_tokens: int | None


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is(*values):
    """Equal to one of `values` and of a matching kind: `logprobs: 0` is not `false` (0 asks
    the completions API for the sampled token's log-probability), `n: true` is not 1."""
    def test(v, ctx):
        return any(v is None if w is None else
                   (isinstance(v, bool) and v is w) if isinstance(w, bool) else
                   (_num(v) and v == w) if _num(w) else v == w for w in values)
    return test


def _any_bool(v, ctx) -> bool:
    return v is None or isinstance(v, bool)


def _top_k(v, ctx) -> bool:
    # -1 and 0 turn it off (vLLM); k >= the vocabulary keeps every token; greedy keeps the top
    return v is None or _int(v) and (v in (-1, 0) or v >= ctx.vocab_size
                                     or (ctx.greedy and v >= 1))


def _min_p(v, ctx) -> bool:
    return v is None or _num(v) and (v == 0 or (ctx.greedy and 0 <= v <= 1))


def _min_tokens(v, ctx) -> bool:
    if v is None or (_int(v) and v == 0):
        return True
    # nothing but max_tokens can end the request before min_tokens: it holds by itself
    return _int(v) and v > 0 and ctx.ignore_eos and not ctx.stops and (
        ctx.max_tokens is None or v <= ctx.max_tokens)


def _length_penalty(v, ctx) -> bool:
    return v is None or _num(v)   # read only by beam search, which is refused


_BOTH = "both"
# field -> (routes: "both", "chat" or "completions"; its test; what it accepts, said)
FIELDS: dict[str, tuple[str, Callable, str]] = {
    "n": (_BOTH, _is(None, 1), "1"),
    "best_of": (_BOTH, _is(None, 1), "1"),
    "use_beam_search": (_BOTH, _is(None, False), "false"),
    "length_penalty": (_BOTH, _length_penalty, "any number (beam search only)"),
    "early_stopping": (_BOTH, _any_bool, "true or false (beam search only)"),
    "presence_penalty": (_BOTH, _is(None, 0), "0"),
    "frequency_penalty": (_BOTH, _is(None, 0), "0"),
    "repetition_penalty": (_BOTH, _is(None, 1), "1"),
    "top_k": (_BOTH, _top_k, ("-1, 0, a k at least the vocabulary size, or any k >= 1 with "
                              "temperature 0")),
    "min_p": (_BOTH, _min_p, "0, or any value in [0, 1] with temperature 0"),
    "min_tokens": (_BOTH, _min_tokens, ("0, or up to max_tokens with ignore_eos and no stop "
                                        "strings")),
    "logprobs": (_BOTH, _is(None, False), "null or false"),
    "top_logprobs": (_BOTH, _is(None, 0), "null or 0"),
    "prompt_logprobs": (_BOTH, _is(None), "null"),
    "echo": (_BOTH, _is(None, False), "false"),
    "suffix": ("completions", _is(None), "null"),
    "logit_bias": (_BOTH, _is(None, {}), "null or {}"),
    "stop_token_ids": (_BOTH, _is(None, []), "null or []"),
    "bad_words": (_BOTH, _is(None, []), "null or []"),
    "allowed_token_ids": (_BOTH, _is(None), "null"),
    "include_stop_str_in_output": (
        _BOTH, lambda v, ctx: _is(None, False)(v, ctx) or (v is True and not ctx.stops),
        "false, or true without stop strings"),
    "skip_special_tokens": (
        _BOTH, lambda v, ctx: _is(None, True)(v, ctx) or (v is False and not ctx.tokenizer),
        "true (false only for a model without a tokenizer, whose text is token ids)"),
    # read only when special tokens are written out, which skip_special_tokens=false asks for
    "spaces_between_special_tokens": (_BOTH, _any_bool, "true or false"),
    "return_token_ids": (_BOTH, _any_bool, "true or false (token_ids are always sent)"),
    "return_tokens_as_token_ids": (_BOTH, _any_bool, "true or false (read with logprobs only)"),
    "truncate_prompt_tokens": (_BOTH, _is(None), "null"),
    "priority": (_BOTH, _is(None, 0), "0"),
    "response_format": (_BOTH, _is(None, {"type": "text"}), "null or {'type': 'text'}"),
    "structured_outputs": (_BOTH, _is(None), "null"),
    "guided_json": (_BOTH, _is(None), "null"),
    "guided_regex": (_BOTH, _is(None), "null"),
    "guided_choice": (_BOTH, _is(None), "null"),
    "guided_grammar": (_BOTH, _is(None), "null"),
    "tools": ("chat", _is(None, []), "null or []"),
    "tool_choice": ("chat", _is(None, "none"), "null or 'none'"),
    "parallel_tool_calls": ("chat", _any_bool, "true or false (read with tools only)"),
    "functions": ("chat", _is(None, []), "null or []"),
    "function_call": ("chat", _is(None, "none"), "null or 'none'"),
    "add_generation_prompt": ("chat", _is(None, True), "true"),
    "continue_final_message": ("chat", _is(None, False), "false"),
    "chat_template": ("chat", _is(None), "null"),
    "chat_template_kwargs": ("chat", _is(None, {}), "null or {}"),
    "documents": ("chat", _is(None), "null"),
    "reasoning_effort": ("chat", _is(None), "null"),
    "modalities": ("chat", _is(None, ["text"]), "null or ['text']"),
}


def names(chat: bool) -> set[str]:
    """The fields of this table a route reads."""
    route = "chat" if chat else "completions"
    return {k for k, (where, _, _) in FIELDS.items() if where in (_BOTH, route)}


def check(body: dict, chat: bool, ctx: Context):
    """(field, message) for the first field of `body` whose value would change the result;
    None when every one leaves it as it is."""
    for key in sorted(names(chat) & set(body)):
        _, test, accepted = FIELDS[key]
        if not test(body[key], ctx):
            return key, (f"{key}={body[key]!r}: not supported by this server, which accepts "
                         f"only {accepted}")
    return None

"""The request bodies the reference target serves: the OpenAI schema subset of /v1/chat/completions and
/v1/completions, validated into `Parsed` (a body that does not fit raises BadRequest naming the field)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from caseledger.target.parts import chat_prompt

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions, used for chat too


class BadRequest(Exception):
    """A request body that does not fit the OpenAI schema subset served here."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True)
class Parsed:
    """The fields of a completion request the engine acts on."""

    prompt: str | list[int]  # text to tokenize, or token ids as given
    max_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    ignore_eos: bool
    cache_prompt: bool
    timings_per_token: bool  # llama.cpp's field: cumulative timings (draft counts) on every content chunk
    model: str | None


def _bool(body: dict[str, Any], key: str, default: bool) -> bool:  # JSON: a request body
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise BadRequest(f"'{key}' must be a boolean", key)
    return value


def _content_text(content: Any, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise BadRequest(f"messages[{i}].content parts must be {{'type': 'text', 'text': str}}", "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"messages[{i}].content must be a string or a list of text parts", "messages")


def _token_ids(value: list[Any]) -> list[int] | None:
    if value and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value):
        return list(value)
    return None


def parse_request(raw: bytes, chat: bool) -> Parsed:
    """Validate a /v1/chat/completions or /v1/completions body (raises BadRequest)."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", "model")
    if body.get("n", 1) not in (1, None):
        raise BadRequest("only n=1 is supported", "n")
    prompt: str | list[int]
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list", "messages")
        turns: list[tuple[str, str]] = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise BadRequest(f"messages[{i}] must be an object with a string 'role'", "messages")
            turns.append((m["role"], _content_text(m.get("content"), i)))
        prompt = chat_prompt(turns)
    else:
        p = body.get("prompt")
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str | list):
            p = p[0]  # a batch of one
        if isinstance(p, str):
            prompt = p
        elif isinstance(p, list) and (ids := _token_ids(p)) is not None:
            prompt = ids
        else:
            raise BadRequest("'prompt' must be a string, a list of token ids, or a batch of one of them", "prompt")
        if not prompt:
            raise BadRequest("'prompt' is empty", "prompt")
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(key)
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadRequest(f"'{key}' must be an integer >= 1", key)
    stream = _bool(body, "stream", False)
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    if options and not stream:
        raise BadRequest("'stream_options' is only allowed with stream: true", "stream_options")
    return Parsed(
        prompt=prompt,
        max_tokens=max_tokens,
        stream=stream,
        include_usage=_bool(options, "include_usage", False),
        continuous_usage=_bool(options, "continuous_usage_stats", False),
        ignore_eos=_bool(body, "ignore_eos", False),
        cache_prompt=_bool(body, "cache_prompt", True),
        timings_per_token=_bool(body, "timings_per_token", False),
        model=model,
    )

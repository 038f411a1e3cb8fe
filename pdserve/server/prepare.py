"""A request body (bytes) -> `Prepared`: checked prompts and one `SamplingParams` per choice.

Runs in a worker thread (JSON parsing, pydantic, tokenisation), never on the event loop.
Choices are indexed across prompts x n: choice `p * n + i` is sample i of prompt p.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.engine.chat_template import ChatTemplate
from pdserve.engine.sampling import SamplingParams
from pdserve.engine.structured_output import GrammarCompiler
from pdserve.engine.tokenizer import TextTokenizer
from pdserve.server.body import parse_json_object
from pdserve.server.chat_template import (
    check_chat_unsupported,
    flatten_messages,
    render_chat,
    request_chat_options,
)
from pdserve.server.errors import APIError, check_model
from pdserve.server.schemas import ChatCompletionRequest, CompletionRequest
from pdserve.server.unknown_fields import UnknownFields
from pdserve.server.validation import (
    Limits,
    check_choices,
    check_completion_unsupported,
    check_stop,
    completion_prompts,
    encode_checked,
    max_tokens_for,
    parse_model,
    refuse_output_beyond_context,
    refuse_unimplemented,
    sampling_params,
    split_prompts,
)


@dataclass(frozen=True)
class Prepared:
    prompts: list[list[int]]
    params: list[SamplingParams]  # one per choice: len(prompts) * n
    n: int
    stream: bool
    include_usage: bool  # a final usage chunk
    continuous_usage: bool  # usage on every chunk
    echo_texts: list[str] | None  # completions with echo: each prompt's text
    logprobs: bool

    def prompt_of(self, choice: int) -> int:
        return choice // self.n


def _stream_flags(body: CompletionRequest | ChatCompletionRequest) -> tuple[bool, bool, bool]:
    stream = bool(body.stream)
    options = body.stream_options
    if options is not None and not stream:
        raise APIError(400, "stream_options needs stream: true", "stream_options")
    include = bool(options and options.include_usage)
    return stream, include, include and bool(options and options.continuous_usage_stats)


def default_grammars(tokenizer: TextTokenizer, limits: Limits) -> GrammarCompiler:
    """A compiler for the checks at the door (the app keeps one; tests may not pass it)."""
    return GrammarCompiler(tokenizer, tokenizer.eos_token_ids, limits.vocab_size)


def prepare_completion(raw_body: bytes, served: str, tokenizer: TextTokenizer,
                       limits: Limits, unknown: UnknownFields | None = None,
                       grammars: GrammarCompiler | None = None) -> Prepared:
    body: CompletionRequest = parse_model(parse_json_object(raw_body), CompletionRequest,
                                          unknown)
    check_model(body.model, served)
    check_completion_unsupported(body)
    n = body.n or 1
    stream, include_usage, continuous = _stream_flags(body)
    originals = split_prompts(body.prompt)
    check_choices(len(originals), n)
    max_tokens = 16 if body.max_tokens is None else body.max_tokens
    per_prompt = sampling_params(body, max_tokens, body.logprobs, limits,  # before tokenising
                                 grammars or default_grammars(tokenizer, limits))
    prompts = completion_prompts(originals, tokenizer, limits, max_tokens,
                                 body.add_special_tokens is not False)
    params = per_prompt * len(prompts)  # choice p * n + i: sample i of prompt p
    echo = None
    if body.echo:
        echo = [text if isinstance(text, str) else tokenizer.decode(ids)
                for text, ids in zip(originals, prompts, strict=True)]
    return Prepared(prompts, params, n, stream, include_usage, continuous, echo,
                    body.logprobs is not None)


def prepare_chat(raw_body: bytes, served: str, tokenizer: TextTokenizer, limits: Limits,
                 template: ChatTemplate, unknown: UnknownFields | None = None,
                 grammars: GrammarCompiler | None = None) -> Prepared:
    body: ChatCompletionRequest = parse_model(parse_json_object(raw_body),
                                              ChatCompletionRequest, unknown)
    check_model(body.model, served)
    check_chat_unsupported(body)
    refuse_unimplemented(body)
    n = body.n or 1
    stream, include_usage, continuous = _stream_flags(body)
    check_choices(1, n)
    check_stop(body.stop)  # the cheap checks before rendering and tokenising
    text = render_chat(template, flatten_messages(body.messages), request_chat_options(body))
    limit, param = ((body.max_completion_tokens, "max_completion_tokens")
                    if body.max_completion_tokens is not None else (body.max_tokens, "max_tokens"))
    refuse_output_beyond_context(limit, limits, param)
    ids = encode_checked(tokenizer, text, limits, "messages", limit or 1,
                         bool(body.add_special_tokens))
    max_tokens = max_tokens_for(limit, len(ids), limits, param)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    params = sampling_params(body, max_tokens, logprobs, limits,
                             grammars or default_grammars(tokenizer, limits))
    return Prepared([ids], params, n, stream, include_usage, continuous, None,
                    logprobs is not None)

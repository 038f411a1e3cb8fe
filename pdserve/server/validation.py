"""From a parsed request body to what the driver runs: checked prompts and `SamplingParams`.

Everything here runs in a worker thread (tokenisation releases the GIL), so a long prompt
does not stall other streams. Every refusal is an `APIError(400)` naming the field:
token ids outside the vocabulary, a prompt plus `max_tokens` beyond the context, seeds
outside 0..2^63-1, more stop strings than `MAX_STOP_STRINGS` (or longer ones than
`MAX_STOP_CHARS`), `stop_token_ids` outside the vocabulary or more than
`MAX_STOP_TOKEN_IDS`, unsupported fields (`tools`, `suffix`, non-text content parts, `echo`
with `logprobs`, and every vLLM field that would change the output and is not implemented:
`refuse_unimplemented`), two structured-output constraints at once or one that does not
compile (`constraints.py`). Cheap checks come first: a text that cannot fit is refused
before it is tokenised, and each prompt of a list is checked against the context as soon as
it is tokenised. Sampling values at the edge of
what the engine can compute are clamped: a temperature or `top_p` below `GREEDY_BELOW`
means greedy, `top_k` of -1 or at least the vocabulary means off.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from pdserve.engine.sampling import SamplingParams
from pdserve.engine.structured_output import GrammarCompiler
from pdserve.engine.tokenizer import TextTokenizer
from pdserve.server.constraints import checked_constraint
from pdserve.server.errors import APIError
from pdserve.server.schemas import (
    MAX_SEED,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_STOP_TOKEN_IDS,
    ChatCompletionRequest,
    CompletionRequest,
)
from pdserve.server.unknown_fields import UnknownFields

GREEDY_BELOW = 1e-5  # a temperature or top_p below this samples the most likely token
MAX_CHOICES = 64  # prompts x n in one request
_TOKEN_ID = re.compile(r"-?[0-9]{1,12}")


@dataclass(frozen=True)
class Limits:
    context_tokens: int
    vocab_size: int


def parse_model(raw: dict[str, Any], schema: type[BaseModel],
                unknown: UnknownFields | None = None) -> Any:
    """`raw` as `schema`; its unknown fields are ignored, and counted by `unknown`."""
    try:
        body = schema.model_validate(raw)
    except ValidationError as err:
        raise schema_error(err) from err
    if body.model_extra and unknown is not None:
        unknown.note(schema.__name__, body.model_extra)
    return body


def schema_error(err: ValidationError) -> APIError:
    """The most specific error about the first field that failed, as a 400."""
    errors = err.errors(include_url=False)
    field = errors[0]["loc"][0] if errors[0]["loc"] else None
    same = [e for e in errors if e["loc"] and e["loc"][0] == field] or errors
    chosen = max(same, key=lambda e: len(e["loc"]))
    path = ".".join(str(part) for part in chosen["loc"] if not _is_union_tag(part))
    shown = repr(chosen.get("input"))
    detail = f" (got {shown[:60]})" if chosen["type"] != "missing" else ""
    return APIError(400, f"{path}: {chosen['msg']}{detail}", path or None)


def _is_union_tag(part: object) -> bool:
    return isinstance(part, str) and ("[" in part or part in {
        "str", "int", "float", "bool", "TextPart", "StreamOptions"})


def encode_checked(tokenizer: TextTokenizer, text: str, limits: Limits, param: str,
                   output_tokens: int, add_special_tokens: bool = False) -> list[int]:
    """`text` tokenised and checked (not empty, in the vocabulary); a text that cannot fit
    beside `output_tokens` is refused before tokenising it (`refuse_unfit_text`)."""
    refuse_unfit_text(text, tokenizer, limits, param, output_tokens)
    [ids] = tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)  # frees GIL
    check_token_ids(ids, limits, param)
    return ids


def refuse_unfit_text(text: str, tokenizer: TextTokenizer, limits: Limits, param: str,
                      output_tokens: int) -> None:
    """Refuse, without tokenising it, a text that cannot fit the context beside
    `output_tokens`: a token stands for at most `max_token_bytes` bytes and a character is at
    least one byte, so a text has at least len(text) / max_token_bytes tokens."""
    room = max(limits.context_tokens - output_tokens, 1)
    if len(text) > room * tokenizer.max_token_bytes:
        raise APIError(400, f"{param}: {len(text)} characters cannot fit the context of "
                       f"{limits.context_tokens} tokens beside {output_tokens} output tokens",
                       param)


def refuse_output_beyond_context(requested: int | None, limits: Limits, param: str) -> None:
    """Refuse `requested` output tokens that leave no room for a prompt, before tokenising."""
    if requested is not None and requested >= limits.context_tokens:
        raise APIError(400, f"{param} ({requested}) plus a prompt of at least one token "
                       f"exceeds the context length {limits.context_tokens}", param)


def check_token_ids(ids: list[int], limits: Limits, param: str) -> None:
    if not ids:
        raise APIError(400, f"{param}: the prompt is empty", param)
    low, high = min(ids), max(ids)
    bad = low if low < 0 else high
    if low < 0 or high >= limits.vocab_size:
        raise APIError(400, f"{param}: token id {bad} is outside the vocabulary "
                       f"(0..{limits.vocab_size - 1})", param)


def _token_ids(value: Any) -> list[int] | None:
    """`value` as token ids (integral floats such as 3.0 included), or None."""
    if not isinstance(value, list):
        return None
    if all(type(item) is int for item in value):
        return value
    if all(type(item) is int or (type(item) is float and item.is_integer()) for item in value):
        return [int(item) for item in value]
    return None


def token_id_list(value: list[Any], limits: Limits, param: str) -> list[int]:
    """`value` as token ids of the vocabulary (an empty list included), or a 400."""
    ids = _token_ids(value)
    if ids is None:
        index = next(i for i, item in enumerate(value) if _token_ids([item]) is None)
        raise APIError(400, f"{param}.{index}: a token id must be an integer, got "
                       f"{repr(value[index])[:40]}", f"{param}.{index}")
    if ids and (min(ids) < 0 or max(ids) >= limits.vocab_size):
        index = next(i for i, token in enumerate(ids) if not 0 <= token < limits.vocab_size)
        raise APIError(400, f"{param}.{index}: token id {ids[index]} is outside the "
                       f"vocabulary (0..{limits.vocab_size - 1})", f"{param}.{index}")
    return ids


def split_prompts(prompt: str | list[Any]) -> list[str | list[int]]:
    """The prompts of a completion request: one text, one token list, or a list of texts
    or of token lists (not mixed), checked element by element."""
    if isinstance(prompt, str) or (prompt and type(prompt[0]) in (int, float)):
        prompts: list[Any] = [prompt]
    else:
        prompts = list(prompt)
    if not prompts:
        raise APIError(400, "prompt: the list of prompts is empty", "prompt")
    if all(isinstance(p, str) for p in prompts):
        return prompts
    ids = [_token_ids(p) for p in prompts]
    if any(p is None for p in ids):
        raise APIError(400, "prompt: must be a string, a list of token ids (integers), or a "
                       "list of strings or of token-id lists", "prompt")
    return ids  # type: ignore[return-value]


def completion_prompts(prompts: list[str | list[int]], tokenizer: TextTokenizer,
                       limits: Limits, max_tokens: int,
                       add_special_tokens: bool = False) -> list[list[int]]:
    """Each prompt as checked token ids. Each is checked against the context as soon as it is
    tokenised (and every text that cannot fit is refused before any is tokenised), so an
    over-long prompt in a list costs at most its own tokenisation."""
    refuse_output_beyond_context(max_tokens, limits, "max_tokens")
    params = ["prompt" if len(prompts) == 1 else f"prompt.{i}" for i in range(len(prompts))]
    for prompt, param in zip(prompts, params, strict=True):
        if isinstance(prompt, str):
            refuse_unfit_text(prompt, tokenizer, limits, param, max_tokens)
    checked = []
    for prompt, param in zip(prompts, params, strict=True):
        if isinstance(prompt, str):
            ids = encode_checked(tokenizer, prompt, limits, param, max_tokens,
                                 add_special_tokens)
        else:
            ids = prompt
            check_token_ids(ids, limits, param)
        max_tokens_for(max_tokens, len(ids), limits, "max_tokens", param)
        checked.append(ids)
    return checked


def refuse_unimplemented(body: CompletionRequest | ChatCompletionRequest) -> None:
    """A 400 naming the first vLLM field set that would change the output and that pdserve
    does not implement (the audit in `schemas.py`)."""
    chat = isinstance(body, ChatCompletionRequest)
    refused = [
        ("use_beam_search", bool(body.use_beam_search)),
        ("truncate_prompt_tokens", body.truncate_prompt_tokens is not None),
        ("allowed_token_ids", body.allowed_token_ids is not None),
        ("prompt_logprobs", body.prompt_logprobs is not None),
        ("logits_processors", bool(body.logits_processors)),
        ("return_tokens_as_token_ids", bool(body.return_tokens_as_token_ids)),
        ("return_token_ids", bool(body.return_token_ids)),
        ("max_repetition_pattern_size", bool(body.max_repetition_pattern_size)),
        ("min_repetition_pattern_size", bool(body.min_repetition_pattern_size)),
        ("repetition_min_count", bool(body.repetition_min_count)),
    ]
    if chat:
        refused += [("chat_template", body.chat_template is not None),
                    ("echo", bool(body.echo)), ("bad_words", bool(body.bad_words))]
    else:
        refused += [("prompt_embeds", body.prompt_embeds is not None)]
    for name, given in refused:
        if given:
            raise APIError(400, f"{name}: not supported by pdserve (it would change the "
                           f"output)", name)


def check_completion_unsupported(body: CompletionRequest) -> None:
    refuse_unimplemented(body)
    if body.suffix:
        raise APIError(400, "suffix: not supported (no fill-in-the-middle)", "suffix")
    if body.echo and body.logprobs is not None:
        raise APIError(400, "echo with logprobs is not supported (prompt logprobs are not "
                       "computed)", "echo")
    if body.best_of is not None and body.best_of != (body.n or 1):
        raise APIError(400, f"best_of: only best_of equal to n ({body.n or 1}) is supported, "
                       f"got {body.best_of}", "best_of")


def max_tokens_for(requested: int | None, prompt_tokens: int, limits: Limits,
                   param: str, prompt_param: str = "prompt") -> int:
    """`requested`, or (None) whatever the context leaves; refused past the context."""
    room = limits.context_tokens - prompt_tokens
    if requested is None:
        if room < 1:
            raise APIError(400, f"the prompt ({prompt_tokens} tokens) leaves no room in the "
                           f"context of {limits.context_tokens} tokens", "messages")
        return room
    if requested > room:
        raise APIError(400, f"{prompt_param} ({prompt_tokens} tokens) plus {param} "
                       f"({requested}) exceeds the context length {limits.context_tokens}",
                       param)
    return requested


def sampling_params(body: CompletionRequest | ChatCompletionRequest, max_tokens: int,
                    logprobs: int | None, limits: Limits,
                    grammars: GrammarCompiler | None = None) -> list[SamplingParams]:
    """One `SamplingParams` per choice (n of them); a seed s gives choices s, s+1, ...
    `grammars` checks a structured-output constraint (needed only when one is asked)."""
    n = body.n or 1
    temperature = 1.0 if body.temperature is None else body.temperature
    top_p = 1.0 if body.top_p is None else body.top_p
    if temperature < GREEDY_BELOW or top_p < GREEDY_BELOW:
        temperature, top_p = 0.0, 1.0
    top_k = body.top_k or 0
    if top_k < 0 or top_k >= limits.vocab_size:
        top_k = 0
    min_tokens = body.min_tokens or 0
    if min_tokens > max_tokens:
        raise APIError(400, f"min_tokens ({min_tokens}) exceeds max_tokens ({max_tokens})",
                       "min_tokens")
    if body.seed is not None and body.seed + n - 1 > MAX_SEED:
        raise APIError(400, f"seed: with n={n} the seeds {body.seed}..{body.seed + n - 1} "
                       f"exceed {MAX_SEED}", "seed")
    stop = check_stop(body.stop)
    common = dict(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
        min_p=body.min_p or 0.0, presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        logit_bias=logit_bias(body.logit_bias, limits), min_tokens=min_tokens,
        logprobs=logprobs, stop=tuple(s for s in stop if s), ignore_eos=bool(body.ignore_eos),
        stop_token_ids=stop_token_ids(body.stop_token_ids, limits),
        include_stop_str_in_output=bool(body.include_stop_str_in_output),
        skip_special_tokens=body.skip_special_tokens is not False,
        spaces_between_special_tokens=body.spaces_between_special_tokens is not False,
        constraint=None if grammars is None else checked_constraint(body, grammars))
    if grammars is None and _asks_for_constraint(body):
        raise APIError(500, "structured outputs are not set up on this server", kind=
                       "server_error")
    try:
        return [SamplingParams(seed=None if body.seed is None else body.seed + i, **common)
                for i in range(n)]
    except ValueError as err:  # the engine's own check, a second line of defence
        raise APIError(400, str(err)) from err


def _asks_for_constraint(body: CompletionRequest | ChatCompletionRequest) -> bool:
    form = body.response_format
    return bool((form is not None and form.type != "text") or body.structured_outputs
                or any(getattr(body, name) is not None for name in (
                    "guided_json", "guided_regex", "guided_choice", "guided_grammar")))


def stop_token_ids(raw: list[Any] | None, limits: Limits) -> tuple[int, ...]:
    """The stop token ids, each in the vocabulary, at most `MAX_STOP_TOKEN_IDS`."""
    if not raw:
        return ()
    if len(raw) > MAX_STOP_TOKEN_IDS:
        raise APIError(400, f"stop_token_ids: at most {MAX_STOP_TOKEN_IDS} token ids are "
                       f"supported, got {len(raw)}", "stop_token_ids")
    return tuple(token_id_list(raw, limits, "stop_token_ids"))


def check_stop(stop: str | list[str] | None) -> list[str]:
    """The stop strings, refused past `MAX_STOP_STRINGS` or `MAX_STOP_CHARS` (schemas.py)."""
    strings = stop if isinstance(stop, list) else [stop or ""]
    if len(strings) > MAX_STOP_STRINGS:
        raise APIError(400, f"stop: at most {MAX_STOP_STRINGS} stop strings are supported, "
                       f"got {len(strings)}", "stop")
    for i, text in enumerate(strings):
        if len(text) > MAX_STOP_CHARS:
            where = f"stop.{i}" if isinstance(stop, list) else "stop"
            raise APIError(400, f"{where}: a stop string may have at most {MAX_STOP_CHARS} "
                           f"characters, got {len(text)}", where)
    return strings


def logit_bias(raw: dict[str, float] | None, limits: Limits) -> tuple[tuple[int, float], ...]:
    if not raw:
        return ()
    biases = {}
    for key, value in raw.items():
        if not _TOKEN_ID.fullmatch(key):
            raise APIError(400, f"logit_bias: key {key[:40]!r} is not a token id", "logit_bias")
        token = int(key)
        if not 0 <= token < limits.vocab_size:
            raise APIError(400, f"logit_bias: token id {token} is outside the vocabulary "
                           f"(0..{limits.vocab_size - 1})", "logit_bias")
        if not -100 <= value <= 100:
            raise APIError(400, f"logit_bias: the bias of token {token} must be in "
                           f"[-100, 100], got {value}", "logit_bias")
        biases[token] = float(value)
    return tuple(sorted(biases.items()))


def check_choices(prompts: int, n: int) -> None:
    if prompts * n > MAX_CHOICES:
        raise APIError(400, f"{prompts} prompts x n={n} is more than {MAX_CHOICES} choices "
                       "in one request", "n")

"""Structured outputs: an `OutputConstraint` (kind + text) compiled by llguidance into a
token-level matcher, one per sequence, whose mask the sampler applies.

llguidance (the Low-level Guidance library, MIT; one of vLLM's structured-output backends)
compiles a JSON Schema, a regular expression, a list of choices or a Lark/GBNF grammar into
an Earley parser over the model's vocabulary, and computes each step's allowed-token mask in
tens of microseconds. Its tokenizer is built here from pdserve's own (`TextTokenizer`): the
bytes each token id stands for and the EOS ids; special tokens are marked special, so no
grammar can produce them as text. Nothing is downloaded.

`GrammarCompiler` (one per engine, and one in the server for the checks at the door) builds
that tokenizer once, on first use, and keeps compiled grammars by (kind, text) in a bounded
LRU cache; each sequence gets a copy (`ConstraintMatcher`). A matcher is advanced with every
token the sequence gets, and rebuilt by advancing a fresh copy through the tokens already
generated, so a sequence resumed after a failover or adopted through a KV hand-off continues
exactly as it would have in place (`rebuild`).

JSON Schemas compile without free whitespace unless the request asks for it (llguidance's
`whitespace_flexible: false`; vLLM's `disable_any_whitespace`): a schema whose strings,
arrays and numbers are bounded then has outputs of bounded length.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from pdserve.engine.sampling_params import OutputConstraint
from pdserve.engine.tokenizer import TextTokenizer

MAX_ERROR_CHARS = 400  # of a grammar error shown to a client
COMPILED_GRAMMARS = 64  # compiled grammars kept per compiler (LRU)
JSON_DEFAULTS = {"whitespace_flexible": False}


class ConstraintError(ValueError):
    """The constraint does not compile (the message is the grammar engine's, bounded)."""


class ConstraintFailure(ValueError):
    """A compiled constraint failed while matching the output (a limit of the grammar
    engine, or a token it does not allow): the request's own content, failing it alone."""


NON_VERBOSE_MARK = "<non-verbose/>"  # llguidance's tail where a parser-state dump would be
BACKTRACE_MARK = "<backtrace>"  # where llguidance appends a Rust panic's stack


def bounded_message(message: str) -> str:
    """A grammar engine's message as a client may see it: without llguidance's marker of
    the state dump it leaves out or a panic's stack, control characters escaped, cut to
    `MAX_ERROR_CHARS`."""
    message = message.split(BACKTRACE_MARK)[0].removesuffix(NON_VERBOSE_MARK).rstrip()
    shown = "".join(char if char.isprintable() else repr(char)[1:-1] for char in message)
    return shown[:MAX_ERROR_CHARS] + ("..." if len(shown) > MAX_ERROR_CHARS else "")


def _llguidance() -> Any:
    """The llguidance module (an optional dependency: the `engine` and `serve` extras)."""
    try:
        import llguidance
    except ImportError as err:
        raise ConstraintError("structured outputs need the llguidance package (pip install "
                              "'pdserve[serve]')") from err
    return llguidance


def _grammar_text(constraint: OutputConstraint) -> str:
    """llguidance's grammar for `constraint` (not yet checked)."""
    llguidance = _llguidance()

    kind, text = constraint.kind, constraint.text
    try:
        if kind == "json":
            return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_DEFAULTS)
        if kind == "choice":
            choices = json.loads(text)
            if not choices:
                raise ConstraintError("choice: the list of choices is empty")
            return llguidance.grammar_from("choice", text)
        return llguidance.grammar_from("regex" if kind == "regex" else "grammar", text)
    except ConstraintError:
        raise
    except (ValueError, TypeError) as err:
        raise ConstraintError(bounded_message(str(err))) from err


def llguidance_tokenizer(tokenizer: TextTokenizer, eos_token_ids: tuple[int, ...],
                         vocab_size: int) -> Any:
    """An `llguidance.LLTokenizer` over pdserve's tokenizer: each id's bytes (special tokens
    marked), `eos_token_ids`, and `vocab_size` rows (the model's logits may have more rows than
    the tokenizer has entries: those stand for no bytes and are never allowed)."""
    llguidance = _llguidance()

    special = tokenizer.special_token_ids()
    table = tokenizer.token_bytes_table()
    tokens = [table[i] if i < len(table) else b"" for i in range(vocab_size)]

    class Wrapped:  # what llguidance's TokenizerWrapper reads
        eos_token_id = eos_token_ids[0]
        bos_token_id = None
        special_token_ids = sorted(i for i in special if i < vocab_size)

        def __init__(self) -> None:
            self.tokens = tokens

        def __call__(self, text: str) -> list[int]:
            if not isinstance(text, str):
                raise TypeError("pdserve's tokenizer encodes text")
            return tokenizer.encode(text)

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapped()), n_vocab=vocab_size,
                                  eos_token=list(eos_token_ids))


class ConstraintMatcher:
    """One sequence's matcher: the allowed-token mask of the next step, advanced token by
    token; `complete` once the constraint admits nothing more (the output is finished)."""

    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self._matcher = matcher
        self.vocab_size = vocab_size

    def allowed_tokens(self, vocab_size: int) -> torch.Tensor:
        """The next step's mask; a matcher that fails computing it (a constraint past one of
        llguidance's limits, or one that admits nothing, such as a schema that only refers to
        itself) raises: its mask would allow only EOS, and the output would end as if it
        were complete."""
        bitmask = self._matcher.compute_bitmask()
        if self._matcher.is_error():
            raise ConstraintFailure("the output constraint cannot be matched: "
                                    f"{bounded_message(self._matcher.get_error())}")
        bits = np.frombuffer(bitmask, dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little")[:self.vocab_size].astype(bool)
        mask = torch.zeros(vocab_size, dtype=torch.bool)
        width = min(vocab_size, self.vocab_size)
        mask[:width] = torch.from_numpy(allowed[:width])
        return mask

    def advance(self, token_id: int) -> None:
        """Take the sequence's next token; a token the constraint does not allow raises."""
        if self._matcher.is_stopped():
            return  # complete: only the end of the output remains (EOS, if sampled)
        if not self._matcher.consume_token(token_id):
            raise ConstraintFailure(f"token {token_id} does not satisfy the output "
                                    f"constraint: {bounded_message(self._matcher.get_error())}")

    @property
    def complete(self) -> bool:
        return bool(self._matcher.is_stopped())


class GrammarCompiler:
    """Compiles constraints for one tokenizer; state: the llguidance tokenizer (built on first
    use) and the compiled grammars (LRU, `COMPILED_GRAMMARS`), with whether each passed
    `check`. Thread-safe (the server checks requests in worker threads).

    The copies of one compiled matcher (one per sequence) share its lexer's cache of regex
    states, and llguidance caps how many it builds: every mask computed on any copy adds
    to it. For an ordinary constraint the cache settles at its automaton's size; a
    pathological one (`(a{1000}){1000}`) exhausts it, so a copy whose first mask was fine
    can leave the next copy none ("too many expressions constructed": that request fails
    alone, with a 400). So nothing here computes a mask it need not: `check` computes the
    first mask once per compiled constraint, and `compile` (a worker's, before the request's
    own matcher) computes none."""

    def __init__(self, tokenizer: TextTokenizer, eos_token_ids: tuple[int, ...],
                 vocab_size: int) -> None:
        self.tokenizer, self.eos_token_ids, self.vocab_size = (tokenizer, eos_token_ids,
                                                               vocab_size)
        self._ll_tokenizer: Any = None
        self._compiled: OrderedDict[OutputConstraint, Any] = OrderedDict()
        self._checked: set[OutputConstraint] = set()  # of `_compiled`'s keys
        self._lock = threading.Lock()

    def _tokenizer(self) -> Any:
        if self._ll_tokenizer is None:
            self._ll_tokenizer = llguidance_tokenizer(self.tokenizer, self.eos_token_ids,
                                                      self.vocab_size)
        return self._ll_tokenizer

    def check(self, constraint: OutputConstraint) -> None:
        """Raise `ConstraintError` (the grammar engine's message) if it does not compile, or
        if it fails computing its first mask (a schema that only refers to itself); the
        first mask only the first time (see the class)."""
        compiled = self._compiled_matcher(constraint)
        with self._lock:
            if constraint in self._checked:
                return
        first = ConstraintMatcher(compiled.deep_copy(), self.vocab_size)
        try:
            first.allowed_tokens(self.vocab_size)
        except ConstraintFailure as err:
            raise ConstraintError(str(err)) from err
        with self._lock:
            if constraint in self._compiled:
                self._checked.add(constraint)

    def compile(self, constraint: OutputConstraint) -> None:
        """Compile `constraint` into the cache (`ConstraintError` if it does not compile),
        computing no mask."""
        self._compiled_matcher(constraint)

    def is_compiled(self, constraint: OutputConstraint) -> bool:
        """Whether `constraint` is compiled here already (`rebuild` then only copies it)."""
        with self._lock:
            return constraint in self._compiled

    def _compiled_matcher(self, constraint: OutputConstraint) -> Any:
        llguidance = _llguidance()

        with self._lock:
            known = self._compiled.get(constraint)
            if known is not None:
                self._compiled.move_to_end(constraint)
                return known
            tokenizer = self._tokenizer()
        grammar = _grammar_text(constraint)
        # errors without the parser's state dump (tokens, row counts, timings): a client
        # gets the reason, not the engine's internals. The matcher reports a grammar that
        # does not compile with `validate_grammar`'s own message, so it is not called too
        # (that compiled every constraint twice: 40 % of a large one's time)
        limits = llguidance.LLParserLimits(verbose_errors=False)
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=limits)
        if matcher.is_error():
            raise ConstraintError(bounded_message(matcher.get_error()))
        with self._lock:
            self._compiled[constraint] = matcher
            while len(self._compiled) > COMPILED_GRAMMARS:
                self._checked.discard(self._compiled.popitem(last=False)[0])
        return matcher

    def rebuild(self, constraint: OutputConstraint, generated: list[int] | tuple[int, ...]
                ) -> ConstraintMatcher:
        """A matcher for `constraint` advanced through the tokens already `generated` (none
        for a new sequence; a resumed or adopted one's output so far)."""
        matcher = ConstraintMatcher(self._compiled_matcher(constraint).deep_copy(),
                                    self.vocab_size)
        for token in generated:
            matcher.advance(token)
        return matcher

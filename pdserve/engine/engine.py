"""The engine of one live instance: sequences, their KV blocks, one forward per batch.

It runs the batches the shared local scheduler plans (`execute(plan)`): each decode advances
one token, each prefill chunk computes its tokens after the sequence's prior context, and a
chunk that completes a (re)prefill samples the next token. Blocks come from the FlowKV
segment allocator and grow with the sequence, continuing its last run where possible.
The local scheduler decides admission and preemption with block counts over the same
number of blocks; the engine owns the real block ids.

Stops: an EOS token (unless `ignore_eos`), a stop string in the generated text (the text is
cut before it), or `max_tokens`. Each sampled token also returns the final hidden state at
that position (the input of an output-length predictor).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pdserve.engine.allocator import SegmentAllocator
from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.model import CausalLM, ForwardBatch
from pdserve.engine.sampling import SamplingParams, sample
from pdserve.engine.text_stream import TextStream
from pdserve.engine.tokenizer import TextTokenizer
from pdserve.engine.transfer import KVHandoff, copy_aligned
from pdserve.instance.local_scheduler import BatchPlan
from pdserve.types import blocks_for


@dataclass
class Sequence:
    request_id: int
    token_ids: list[int]
    prompt_tokens: int
    params: SamplingParams
    generator: torch.Generator | None
    computed_tokens: int = 0  # tokens whose KV is in the pool
    blocks: list[int] = field(default_factory=list)
    finish_reason: str = ""  # "stop" (EOS or stop string) or "length"
    stream: TextStream | None = None  # stop-string detection (when there are stop strings)

    @property
    def generated(self) -> list[int]:
        return self.token_ids[self.prompt_tokens:]


@dataclass
class TokenOutput:
    request_id: int
    token_id: int
    logits: torch.Tensor  # at the position that produced token_id
    hidden: torch.Tensor  # final hidden state there (after the last norm)
    finish_reason: str  # "" while running


class Engine:
    def __init__(self, model: CausalLM, tokenizer: TextTokenizer | None, num_blocks: int,
                 shared_name: str | None = None) -> None:
        config = model.config
        self.model = model
        self.tokenizer = tokenizer
        self.pool = PagedKVPool(num_blocks, config.num_layers, config.num_kv_heads,
                                config.head_dim, shared_name=shared_name)
        self.allocator = SegmentAllocator(num_blocks)
        self.sequences: dict[int, Sequence] = {}

    # ---- sequences ----
    def add(self, request_id: int, prompt_ids: list[int], params: SamplingParams,
            resume_ids: tuple[int, ...] | list[int] = ()) -> None:
        """Start a sequence. `resume_ids` are tokens an earlier attempt already generated:
        they are prefilled with the prompt and count as generated (in `max_tokens`)."""
        if request_id in self.sequences:
            raise ValueError(f"request {request_id} is already on this engine")
        if not prompt_ids:
            raise ValueError("a prompt needs at least one token")
        self._check_vocab("prompt", prompt_ids)
        self._check_vocab("resumed output", resume_ids)
        limit = self.model.config.max_position_embeddings
        if len(prompt_ids) + params.max_tokens > limit:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) plus max_tokens "
                             f"({params.max_tokens}) exceeds the context length {limit}")
        if len(resume_ids) >= params.max_tokens:
            raise ValueError(f"{len(resume_ids)} resumed tokens leave nothing to generate "
                             f"under max_tokens {params.max_tokens}")
        generator = None
        if params.temperature > 0:
            generator = torch.Generator()
            generator.manual_seed(params.seed if params.seed is not None else request_id)
        stream = None
        if params.stop:
            if self.tokenizer is None:
                raise ValueError("stop strings need a tokenizer; this model has none")
            stream = TextStream(self.tokenizer, params.stop)
            for token in resume_ids:  # a stop string may span the resumed boundary
                stream.push(token)
        self.sequences[request_id] = Sequence(request_id, [*prompt_ids, *resume_ids],
                                              len(prompt_ids), params, generator,
                                              stream=stream)

    def _check_vocab(self, what: str, token_ids: tuple[int, ...] | list[int]) -> None:
        vocab = self.model.config.vocab_size
        if not token_ids or (min(token_ids) >= 0 and max(token_ids) < vocab):
            return  # the common case, without a Python loop
        for position, token in enumerate(token_ids):
            if not 0 <= token < vocab:
                raise ValueError(f"{what} token id {token!r} at position {position} is "
                                 f"outside the vocabulary (0..{vocab - 1})")

    def release(self, request_id: int) -> Sequence:
        """Forget a sequence and free its blocks (finished, cancelled or moved away)."""
        sequence = self.sequences.pop(request_id)
        self._drop_kv(sequence)
        return sequence

    def _drop_kv(self, sequence: Sequence) -> None:
        if sequence.blocks:
            self.allocator.free(sequence.blocks)
        sequence.blocks, sequence.computed_tokens = [], 0

    def _grow(self, sequence: Sequence, tokens: int) -> None:
        need = blocks_for(tokens) - len(sequence.blocks)
        if need > 0:
            after = sequence.blocks[-1] if sequence.blocks else None
            sequence.blocks += self.allocator.allocate(need, after=after)

    # ---- execution ----
    def execute(self, plan: BatchPlan) -> list[TokenOutput]:
        """Run a plan of the local scheduler (one step); sequences it preempted lose their
        KV first and will be recomputed from their tokens."""
        for request in plan.preempted:
            self._drop_kv(self.sequences[request.request_id])
        return self.run([r.request_id for r in plan.decodes],
                        [(r.request_id, tokens) for r, tokens in plan.chunks])

    def run(self, decodes: list[int], chunks: list[tuple[int, int]]) -> list[TokenOutput]:
        work = [(self.sequences[rid], 1) for rid in decodes]
        work += [(self.sequences[rid], tokens) for rid, tokens in chunks]
        if not work:
            return []
        token_ids, positions, slot_blocks, slot_offsets = [], [], [], []
        new_tokens, contexts, tables = [], [], []
        block_size = self.pool.block_size
        for sequence, count in work:
            start = sequence.computed_tokens
            if start + count > len(sequence.token_ids):
                raise ValueError(f"request {sequence.request_id}: {count} tokens asked after "
                                 f"{start}, only {len(sequence.token_ids)} known")
            self._grow(sequence, start + count)
            token_ids += sequence.token_ids[start:start + count]
            span = range(start, start + count)
            positions += span
            slot_blocks += [sequence.blocks[p // block_size] for p in span]
            slot_offsets += [p % block_size for p in span]
            new_tokens.append(count)
            contexts.append(start + count)
            tables.append(torch.tensor(sequence.blocks[:blocks_for(start + count)]))
        batch = ForwardBatch(torch.tensor(token_ids), torch.tensor(positions), new_tokens,
                             contexts, tables, torch.tensor(slot_blocks),
                             torch.tensor(slot_offsets))
        if decodes:  # decodes come first in `work`: batch their attention
            width = max(len(table) for table in tables[:len(decodes)])
            padded = torch.zeros(len(decodes), width, dtype=torch.long)
            for row, table in enumerate(tables[:len(decodes)]):
                padded[row, :len(table)] = table
            batch.num_decodes = len(decodes)
            batch.decode_tables = padded
            batch.decode_context = torch.tensor(contexts[:len(decodes)])
        logits, hidden = self.model(batch, self.pool)
        outputs = []
        for index, (sequence, count) in enumerate(work):
            sequence.computed_tokens += count
            if sequence.computed_tokens < len(sequence.token_ids):
                continue  # a chunk in the middle of a prefill samples nothing
            token = sample(logits[index], sequence.params, sequence.generator)
            sequence.token_ids.append(token)
            sequence.finish_reason = self._stop_reason(sequence, token)
            outputs.append(TokenOutput(sequence.request_id, token, logits[index],
                                       hidden[index], sequence.finish_reason))
        return outputs

    def _stop_reason(self, sequence: Sequence, token: int) -> str:
        params = sequence.params
        eos = self.model.config.eos_token_ids or (
            self.tokenizer.eos_token_ids if self.tokenizer else ())
        if token in eos and not params.ignore_eos:
            return "stop"
        if sequence.stream is not None:
            sequence.stream.push(token)
            if sequence.stream.stopped:
                return "stop"
        if len(sequence.generated) >= params.max_tokens:
            return "length"
        return ""

    def text_of(self, request_id: int) -> str:
        """The generated text (cut before a stop string)."""
        sequence = self.sequences[request_id]
        if sequence.stream is not None:
            return sequence.stream.text
        return self.tokenizer.decode(sequence.generated) if self.tokenizer else ""

    # ---- hand-off between instances ----
    def export(self, request_id: int) -> KVHandoff:
        sequence = self.sequences[request_id]
        rng = sequence.generator
        return KVHandoff(request_id, tuple(sequence.token_ids), sequence.prompt_tokens,
                         sequence.computed_tokens, sequence.params,
                         tuple(sequence.blocks[:blocks_for(sequence.computed_tokens)]),
                         self.pool.shared_name,
                         None if rng is None else rng.get_state().numpy().tobytes())

    def adopt(self, handoff: KVHandoff) -> list[int]:
        """Create the sequence of a hand-off with blocks for its KV (not yet filled);
        returns those blocks, in order, for the copy."""
        self.add(handoff.request_id, list(handoff.token_ids[:handoff.prompt_tokens]),
                 handoff.params)
        sequence = self.sequences[handoff.request_id]
        sequence.token_ids = list(handoff.token_ids)
        if sequence.stream is not None:
            for token in sequence.generated:
                sequence.stream.push(token)
        self._grow(sequence, handoff.computed_tokens)
        sequence.computed_tokens = handoff.computed_tokens
        if sequence.generator is not None and handoff.rng_state is not None:
            state = torch.frombuffer(bytearray(handoff.rng_state), dtype=torch.uint8)
            sequence.generator.set_state(state)  # continue the sender's random stream
        return sequence.blocks

    def import_from(self, handoff: KVHandoff, source: PagedKVPool) -> int:
        """Adopt a sequence and copy its KV from a mapped source pool; returns copies."""
        blocks = self.adopt(handoff)
        return copy_aligned(source, self.pool, list(handoff.blocks), blocks)

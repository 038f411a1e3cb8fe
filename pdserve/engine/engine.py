"""The engine of one live instance: sequences, their KV blocks, one forward per batch.

It runs the batches the shared local scheduler plans (`execute(plan)`): each decode advances
one token, each prefill chunk computes its tokens after the sequence's prior context, and a
chunk that completes a (re)prefill samples the next token. Blocks come from the FlowKV
segment allocator and grow with the sequence, continuing its last run where possible.
The local scheduler decides admission and preemption with block counts over the same
number of blocks; the engine owns the real block ids.

Stops: an EOS token (unless `ignore_eos`) or one of `stop_token_ids`, a stop string in the
generated text (the text is cut before it), a structured-output constraint that admits
nothing more, or `max_tokens`; before `min_tokens` output tokens neither a stop token nor a
stop string ends a sequence. Each sampled token also returns the final hidden state at that
position (the input of an output-length predictor) and, when asked, its logprobs
(`sampling.TokenLogprob`, from the raw logits: for a constrained sequence too, see
`sampling.py`); a sequence asking for prompt logprobs gets them computed during its first
prefill.

Structured outputs (`structured_output.py`): a sequence whose params carry a constraint gets a
matcher from the engine's `GrammarCompiler` (built on first use); the sampler masks what the
matcher disallows (`logits_processing.py`), and each sampled token advances it. EOS is
allowed only where the constraint accepts the output; once it admits nothing more the
sequence ends with "stop" (without sampling an EOS).

With `hidden_state_every_tokens=k` the engine also keeps that hidden state whenever a
sequence's output count reaches a multiple of k, for the length predictor
(`take_hidden_states`, `hidden_capture.py`).

Sampling runs on the engine's device, on float32 logits (`sampling.py`): a step reads back
the sampled ids and the logprobs asked for, not the logits. A `TokenOutput`'s logits and
hidden state stay on the device (views of the step's outputs) until someone asks for them.
Sampling is a pure function of (seed or request id, output index, logits) (`sampling.py`),
so a sequence resumed from tokens already generated (`add(..., resume_ids)`) or adopted
from another instance continues exactly as it would have in place; its constraint matcher
is rebuilt by advancing it through those tokens (`rewind` does the same after a failed
batch).

A sequence and its KV move between instances: `export` describes a sequence's KV for a
hand-off; `adopt` creates the sequence on the receiving engine with blocks for it;
`import_from` adopts and copies the KV from the sender's mapped pool (aligned runs,
`transfer.copy_aligned`), taking over a session's history kept here and copying only what
is new; `import_history` keeps a session's history read from another worker.

With a prefix cache (`enable_prefix_cache`), the engine follows the local scheduler's
`PrefixCache` (`follow_prefix_cache`): `prefix_blocks.py` keeps the block ids of each entry;
evicted entries' blocks are freed here, donated ones stay at the front of their sequence
(not freed with it), and a prefill with a hit starts on the cached blocks.
"""

from __future__ import annotations

import numpy as np
import torch

from pdserve.engine import batched_prefill
from pdserve.engine.allocator import SegmentAllocator
from pdserve.engine.decode_graphs import DecodeGraphs
from pdserve.engine.device import EngineDevice, place
from pdserve.engine.elementwise import EAGER, fused
from pdserve.engine.hidden_capture import HiddenStateCapture
from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.model import CausalLM, ForwardBatch, on_device
from pdserve.engine.paged_attention import PagedAttention, wanted
from pdserve.engine.prefix_blocks import PrefixBlocks
from pdserve.engine.prompt_logprobs import prompt_logprob_rows, record_prompt_logprobs
from pdserve.engine.sampling import TokenLogprob, sample_batch, token_logprobs
from pdserve.engine.sampling_params import SamplingParams
from pdserve.engine.sequence import Sequence, TokenOutput
from pdserve.engine.sessions import HistoryRef, SessionKVStore
from pdserve.engine.structured_output import GrammarCompiler
from pdserve.engine.text_stream import TextStream
from pdserve.engine.tokenizer import TextTokenizer
from pdserve.engine.transfer import KVHandoff, copy_aligned
from pdserve.instance.local_scheduler import BatchPlan
from pdserve.types import Request, blocks_for


class Engine:
    def __init__(self, model: CausalLM, tokenizer: TextTokenizer | None, num_blocks: int,
                 shared_name: str | None = None, device: EngineDevice | None = None,
                 hidden_state_every_tokens: int = 0) -> None:
        """`device`: where weights and KV live and their dtype (`engine/device.py`;
        default the CPU in float32)."""
        config = model.config
        self.where = device or EngineDevice()
        self.model = place(model, self.where)
        self.model.use_elementwise(fused() if self.where.fused_elementwise else EAGER)
        self.tokenizer = tokenizer
        self.pool = PagedKVPool(num_blocks, config.num_layers, config.num_kv_heads,
                                config.head_dim, shared_name=shared_name,
                                dtype=self.where.torch_dtype, device=self.where.torch_device,
                                staged=self.where.kv_staging)
        self.allocator = SegmentAllocator(num_blocks)
        self.decode_graphs: DecodeGraphs | None = None
        self.batch_prefills = False  # True: chunks attend in one call on any device (tests;
        # a GPU batches two or more anyway: `batched_prefill.wanted`)
        self.sequences: dict[int, Sequence] = {}
        self.prefix_blocks: PrefixBlocks | None = None  # `enable_prefix_cache`
        self.computed_tokens_total = 0  # tokens run through the model, prefills and decodes
        self.sessions = SessionKVStore(self.allocator)  # history KV kept between rounds
        self.prefill_tokens_total = 0  # prompt tokens computed by prefill chunks
        self.reused_tokens_total = 0  # tokens whose KV a session's history provided
        # every k generated tokens, a sequence's hidden vector for the length predictor
        self.hidden_capture = HiddenStateCapture(hidden_state_every_tokens)
        self._grammars: GrammarCompiler | None = None  # built by the first constraint
        # attention in place over the pool (`paged_attention.py`), or None: gathered
        self.paged_attention = (PagedAttention(self.pool) if wanted(self.where.attention)
                                else None)
        if not self.where.on_cpu and self.where.cuda_graphs and num_blocks > 1:
            self.enable_decode_graphs()

    def enable_decode_graphs(self, capture: bool = True) -> None:
        """Decode-only steps from CUDA graphs (`decode_graphs.py`; `capture=False`: their
        padded static path, eagerly). Call before any sequence: the pool's last block becomes
        the padding rows' scratch, outside the allocator."""
        assert not self.sequences, "decode graphs are set up on an empty engine"
        scratch = self.pool.num_blocks - 1
        self.allocator = SegmentAllocator(scratch)
        self.sessions = SessionKVStore(self.allocator)
        self.decode_graphs = DecodeGraphs(self.model, self.pool, scratch, capture,
                                          self.paged_attention)

    # ---- sequences ----
    def add(self, request_id: int, prompt_ids: list[int], params: SamplingParams,
            resume_ids: tuple[int, ...] = (), session_id: int = -1) -> int:
        """A new sequence; `resume_ids` are output tokens already generated (by a run that
        failed): they follow the prompt as generated tokens and are prefilled with it.
        A session's sequence starts on the history KV kept here (`session_kv`) as far as
        its tokens agree with it; returns the tokens reused (computed already)."""
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
        self._check_vocab("stop token", params.stop_token_ids)
        sequence = Sequence(
            request_id, list(prompt_ids) + list(resume_ids), len(prompt_ids), params,
            prompt_logprobs=[] if params.prompt_logprobs is None else [None])
        self._follow_output(sequence)
        self.sequences[request_id] = sequence
        if session_id < 0 or session_id not in self.sessions:
            return 0
        tokens, sequence.blocks = self._reuse_history(session_id, sequence.token_ids,
                                                      len(sequence.token_ids) - 1)
        sequence.computed_tokens = tokens
        return tokens

    def _follow_output(self, sequence: Sequence) -> None:
        """The sequence's stop-string stream and constraint matcher, advanced through its
        output so far (resumed, adopted or kept after a rewind)."""
        params, generated = sequence.params, sequence.generated
        sequence.stream = None
        if params.stop:
            if self.tokenizer is None:
                raise ValueError("stop strings need a tokenizer; this model has none")
            sequence.stream = TextStream.for_params(self.tokenizer, params,
                                                    self._eos_token_ids())
            for token in generated:
                sequence.stream.push(token)
        sequence.grammar = None
        if params.constraint is not None:
            sequence.grammar = self.grammars().rebuild(params.constraint, generated)

    def grammars(self) -> GrammarCompiler:
        """The compiler of this engine's structured-output constraints (built on first use)."""
        if self._grammars is None:
            if self.tokenizer is None:
                raise ValueError("structured outputs need a tokenizer; this model has none")
            self._grammars = GrammarCompiler(self.tokenizer, self._eos_token_ids(),
                                             self.model.config.vocab_size)
        return self._grammars

    def rewind(self, request_id: int, length: int) -> None:
        """Forget the sequence's tokens past `length` (a batch that failed after sampling):
        its stream and matcher follow the tokens kept."""
        sequence = self.sequences[request_id]
        if len(sequence.token_ids) > length:
            del sequence.token_ids[length:]
            self._follow_output(sequence)

    def _reuse_history(self, session_id: int, token_ids: list[int] | tuple[int, ...],
                       limit: int) -> tuple[int, list[int]]:
        self.sessions.trim(session_id, self.sessions.reusable(session_id, token_ids, limit))
        tokens, blocks = self.sessions.take(session_id)
        self.reused_tokens_total += tokens
        return tokens, blocks

    def _check_vocab(self, what: str, token_ids: tuple[int, ...] | list[int]) -> None:
        vocab = self.model.config.vocab_size
        if not token_ids or (min(token_ids) >= 0 and max(token_ids) < vocab):
            return  # the common case, without a Python loop
        for position, token in enumerate(token_ids):
            if not 0 <= token < vocab:
                raise ValueError(f"{what} token id {token!r} at position {position} is "
                                 f"outside the vocabulary (0..{vocab - 1})")

    def release(self, request_id: int, keep_session: int = -1) -> Sequence:
        """Forget a sequence and free its blocks (finished, cancelled or moved away), or
        keep its KV as the history of session `keep_session`."""
        sequence = self.sequences.pop(request_id)
        if keep_session >= 0 and sequence.computed_tokens:
            self.sessions.keep(keep_session, sequence.token_ids[:sequence.computed_tokens],
                               sequence.blocks)
            sequence.blocks, sequence.computed_tokens = [], 0
        else:
            self._drop_kv(sequence)
        return sequence

    def _drop_kv(self, sequence: Sequence) -> None:
        if len(sequence.blocks) > sequence.shared_blocks:
            self.allocator.free(sequence.blocks[sequence.shared_blocks:])
        sequence.blocks, sequence.computed_tokens, sequence.shared_blocks = [], 0, 0

    def _grow(self, sequence: Sequence, tokens: int) -> None:
        need = blocks_for(tokens) - len(sequence.blocks)
        if need > 0:
            after = sequence.blocks[-1] if sequence.blocks else None
            sequence.blocks += self.allocator.allocate(need, after=after)

    # ---- hand-offs between instances ----
    def export(self, request_id: int) -> KVHandoff:
        sequence = self.sequences[request_id]
        self.pool.stage(sequence.blocks[:blocks_for(sequence.computed_tokens)])  # a GPU's
        return KVHandoff(request_id, tuple(sequence.token_ids), sequence.prompt_tokens,
                         sequence.computed_tokens, sequence.params,
                         tuple(sequence.blocks[:blocks_for(sequence.computed_tokens)]),
                         self.pool.shared_name)

    def adopt(self, handoff: KVHandoff) -> list[int]:
        """Create the sequence of a hand-off with blocks for its KV (not yet filled);
        returns those blocks, in order, for the copy."""
        prompt = handoff.token_ids[:handoff.prompt_tokens]
        self.add(handoff.request_id, list(prompt), handoff.params,
                 handoff.token_ids[handoff.prompt_tokens:])
        sequence = self.sequences[handoff.request_id]
        self._grow(sequence, handoff.computed_tokens)
        sequence.computed_tokens = handoff.computed_tokens
        return sequence.blocks

    def import_history(self, ref: HistoryRef, source: PagedKVPool) -> int:
        """Copy a session's history from another worker's pool and keep it here, so the
        session's request prefilled here next computes only its new tokens; returns the
        copy operations."""
        blocks = self.allocator.allocate(len(ref.blocks))
        copies = copy_aligned(source, self.pool, list(ref.blocks), blocks)
        self.sessions.adopt(ref, blocks)
        return copies

    def import_from(self, handoff: KVHandoff, source: PagedKVPool,
                    session_id: int = -1) -> int:
        """Adopt a sequence and copy its KV from a mapped source pool; returns copies.
        With a session whose history is kept here, the history's blocks are taken over and
        only the blocks from the first new token on are copied."""
        if session_id < 0 or session_id not in self.sessions:
            blocks = self.adopt(handoff)
            return copy_aligned(source, self.pool, list(handoff.blocks), blocks)
        prompt = handoff.token_ids[:handoff.prompt_tokens]
        self.add(handoff.request_id, list(prompt), handoff.params,
                 handoff.token_ids[handoff.prompt_tokens:])
        sequence = self.sequences[handoff.request_id]
        tokens, sequence.blocks = self._reuse_history(session_id, handoff.token_ids,
                                                      handoff.computed_tokens)
        self._grow(sequence, handoff.computed_tokens)
        sequence.computed_tokens = handoff.computed_tokens
        first = tokens // self.pool.block_size  # a partial block is copied whole
        return copy_aligned(source, self.pool, list(handoff.blocks)[first:],
                            sequence.blocks[first:])

    # ---- the prefix cache ----
    def enable_prefix_cache(self, block_tokens: int) -> None:
        self.prefix_blocks = PrefixBlocks(block_tokens, self.pool.block_size)

    @property
    def prefix_hit_tokens_total(self) -> int:
        """Prompt tokens taken from the prefix cache."""
        return self.prefix_blocks.hit_tokens_total if self.prefix_blocks is not None else 0

    def follow_prefix_cache(self, evicted: list[int], donated: list[tuple[int, int, int]]
                            ) -> None:
        """Apply the cache's events: evicted entries free their blocks; donated ones take
        the (request id, hash index, hash) block of that sequence."""
        assert self.prefix_blocks is not None
        for blocks in self.prefix_blocks.evict(evicted):
            self.allocator.free(blocks)
        for request_id, index, block_hash in donated:
            sequence = self.sequences[request_id]
            sequence.shared_blocks = self.prefix_blocks.donate(block_hash, sequence.blocks,
                                                               index)

    def attach_prefix_hits(self, plan: BatchPlan) -> None:
        """Prefills the local scheduler admitted with prefix hits start on the cached
        blocks, computed up to the hit (idempotent)."""
        for request, _ in plan.chunks:
            if request.cached_blocks:
                self._reuse_prefix(request)

    def _reuse_prefix(self, request: Request) -> None:
        sequence = self.sequences[request.request_id]
        if self.prefix_blocks is None or sequence.blocks or sequence.computed_tokens:
            return
        sequence.blocks = self.prefix_blocks.hit(request.hash_ids[:request.cached_blocks])
        sequence.shared_blocks = len(sequence.blocks)
        sequence.computed_tokens = sequence.shared_blocks * self.pool.block_size

    # ---- execution ----
    def execute(self, plan: BatchPlan) -> list[TokenOutput]:
        """Run a plan of the local scheduler (one step); sequences it preempted lose their
        KV first and will be recomputed from their tokens."""
        for request in plan.preempted:
            self._drop_kv(self.sequences[request.request_id])
        self.attach_prefix_hits(plan)
        return self.run([r.request_id for r in plan.decodes],
                        [(r.request_id, tokens) for r, tokens in plan.chunks])

    def run(self, decodes: list[int], chunks: list[tuple[int, int]]) -> list[TokenOutput]:
        work = [(self.sequences[rid], 1) for rid in decodes]
        work += [(self.sequences[rid], tokens) for rid, tokens in chunks]
        if not work:
            return []
        self.computed_tokens_total += sum(count for _, count in work)
        self.prefill_tokens_total += sum(tokens for _, tokens in chunks)
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
        chunks = len(work) - len(decodes)
        batch.paged = self.paged_attention
        if chunks and (self.batch_prefills or batch.paged is not None
                       or batched_prefill.wanted(self.where.torch_device, chunks)):
            batch.prefill_padding = batched_prefill.pad(new_tokens[len(decodes):],
                                                        contexts[len(decodes):],
                                                        tables[len(decodes):])
        prompt_rows = prompt_logprob_rows(work)
        if prompt_rows:
            batch.extra_rows = torch.tensor([row for _, row, _ in prompt_rows])
        if self.decode_graphs is not None and self.decode_graphs.fits(batch):
            logits, hidden = self.decode_graphs.run(batch)  # copies of the graph outputs
        else:
            if not self.where.on_cpu:
                batch = on_device(batch, self.where.torch_device)
            logits, hidden = self.model(batch, self.pool)
        # sampled where they are (`sampling.py`): only the ids and asked logprobs come back
        logits, hidden = logits.float(), hidden.float()
        if prompt_rows:
            record_prompt_logprobs(prompt_rows, logits[len(work):])
        done = []
        for index, (sequence, count) in enumerate(work):
            sequence.computed_tokens += count
            if sequence.computed_tokens == len(sequence.token_ids):
                done.append(index)  # a chunk in the middle of a prefill samples nothing
        if not done:
            return []
        sequences = [work[index][0] for index in done]
        rows = logits[done] if len(done) < len(logits) else logits
        tokens = sample_batch(rows, sequences, self._eos_token_ids())
        asking = [i for i, sequence in enumerate(sequences)
                  if sequence.params.logprobs is not None]
        logprobs: list[TokenLogprob | None] = [None] * len(sequences)
        if asking:
            computed = token_logprobs(rows[asking], [tokens[i] for i in asking],
                                      [sequences[i].params.logprobs or 0 for i in asking])
            for i, logprob in zip(asking, computed, strict=True):
                logprobs[i] = logprob
        outputs = []
        for i, (index, sequence, token) in enumerate(zip(done, sequences, tokens, strict=True)):
            sequence.token_ids.append(token)
            sequence.finish_reason = self._stop_reason(sequence, token)
            outputs.append(TokenOutput(sequence.request_id, token, logits[index],
                                       hidden[index], sequence.finish_reason, logprobs[i]))
            if self.hidden_capture.enabled:
                self.hidden_capture.offer(sequence.request_id, len(sequence.generated),
                                          hidden[index])
        return outputs

    def capture_hidden_states(self, every_tokens: int) -> None:
        """From now on keep each sequence's hidden vector every `every_tokens` (0: off)."""
        self.hidden_capture = HiddenStateCapture(every_tokens)

    def take_hidden_states(self) -> dict[int, np.ndarray]:
        """Request id -> float32 hidden vector captured since the last call, one whenever a
        sequence's generated-token count reached a multiple of `hidden_state_every_tokens`
        (`hidden_capture.py`); empty when capture is off."""
        return self.hidden_capture.take()

    def _eos_token_ids(self) -> tuple[int, ...]:
        return tuple(self.model.config.eos_token_ids or (
            self.tokenizer.eos_token_ids if self.tokenizer else ()))

    def _stop_reason(self, sequence: Sequence, token: int) -> str:
        params = sequence.params
        early = len(sequence.generated) < params.min_tokens  # stop tokens are masked there
        if token in params.stop_tokens(self._eos_token_ids()) and not early:
            return "stop"
        if sequence.grammar is not None:
            sequence.grammar.advance(token)
            if sequence.grammar.complete:
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
        params = sequence.params
        return self.tokenizer.decode(sequence.generated, params.skip_special_tokens,
                                     params.spaces_between_special_tokens
                                     ) if self.tokenizer else ""

"""Decode steps replayed from CUDA graphs (what vLLM does for decode), so a GPU step is
not bound by launching the eager model's few thousand kernels one by one from Python.

Measured first (docs/results/gpu.md): eagerly, a decode step of SmolLM2 on an H100 took
23-30 ms and one of Llama-3.1-8B 27-43 ms at every batch size from 1 to 32, against GPU
work of a few milliseconds: the host issuing ~35 kernels per layer was the step.

A decode-only batch (no prefill chunk, no prompt-logprob rows) is padded to a bucket:
`batch_bucket` sequences (powers of two) by `width_bucket` blocks of context (powers of two,
at least `MIN_WIDTH_BLOCKS`). Each bucket's forward is captured once, on first use, into a
graph over static input buffers; a step copies its inputs into them, replays, and copies the
outputs out (they stay on the device: the engine samples there). Padding
rows decode token 0 at position 0 and write their K/V into a scratch block the engine
keeps out of its allocator (the pool's last block), so they never touch a sequence's KV;
padding columns of the block table point at block 0 and are masked by context length, as
in the eager path. Graphs share one memory pool (they replay one at a time, and each
step's outputs are copied out before the next). A bucket whose gathered context
would exceed `MAX_GATHER_TOKENS` runs eagerly.

`capture=False` runs the same padded static forward eagerly: on the CPU this exercises the
padding (tests/test_decode_graphs.py) without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pdserve.engine.kv_pool import PagedKVPool
from pdserve.engine.model import CausalLM, ForwardBatch
from pdserve.engine.paged_attention import PagedAttention

MIN_WIDTH_BLOCKS = 16  # 256 tokens of context
MAX_BATCH = 256
MAX_GATHER_TOKENS = 1 << 20  # per layer: padded sequences x padded context


def bucket(value: int, smallest: int = 1) -> int:
    """The power of two at least `value` (and at least `smallest`)."""
    size = smallest
    while size < value:
        size *= 2
    return size


@dataclass
class _Captured:
    batch: ForwardBatch  # the static inputs
    graph: torch.cuda.CUDAGraph | None
    logits: torch.Tensor | None = None
    hidden: torch.Tensor | None = None


class DecodeGraphs:
    def __init__(self, model: CausalLM, pool: PagedKVPool, scratch_block: int,
                 capture: bool = True, paged: PagedAttention | None = None) -> None:
        """`paged`: the engine's in-place attention, which the graphs then capture (its
        masks are built inside the forward, from the static tables)."""
        self.model, self.pool, self.scratch_block = model, pool, scratch_block
        self.paged = paged
        self.capture = capture
        self.device = pool.data.device
        self.graphs: dict[tuple[int, int], _Captured] = {}
        self.memory_pool = torch.cuda.graph_pool_handle() if capture else None
        self.replays_total = 0

    def fits(self, batch: ForwardBatch) -> bool:
        """A decode-only batch within the captured sizes."""
        if batch.num_decodes != len(batch.new_tokens) or batch.extra_rows is not None:
            return False
        assert batch.decode_tables is not None
        rows = bucket(batch.num_decodes)
        width = bucket(batch.decode_tables.shape[1], MIN_WIDTH_BLOCKS)
        return rows <= MAX_BATCH and rows * width * self.pool.block_size <= MAX_GATHER_TOKENS

    def run(self, batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, hidden) of the batch's sequences, from the bucket's graph; `batch` is
        on the host."""
        assert batch.decode_tables is not None and batch.decode_context is not None
        decodes, width = batch.num_decodes, batch.decode_tables.shape[1]
        key = (bucket(decodes), bucket(width, MIN_WIDTH_BLOCKS))
        captured = self.graphs.get(key) or self._capture(*key)
        static = captured.batch
        self._reset(static)
        static.token_ids[:decodes].copy_(batch.token_ids)
        static.positions[:decodes].copy_(batch.positions)
        static.slot_blocks[:decodes].copy_(batch.slot_blocks)
        static.slot_offsets[:decodes].copy_(batch.slot_offsets)
        assert static.decode_tables is not None and static.decode_context is not None
        static.decode_tables[:decodes, :width].copy_(batch.decode_tables)
        static.decode_context[:decodes].copy_(batch.decode_context)
        if captured.graph is None:  # eager, on the static buffers
            logits, hidden = self.model(static, self.pool)
        else:
            captured.graph.replay()
            self.replays_total += 1
            assert captured.logits is not None and captured.hidden is not None
            logits, hidden = captured.logits, captured.hidden
        # copies: the graph's outputs are overwritten by its next replay, and the step's
        # outputs (sampled on the device) may outlive it
        return logits[:decodes].clone(), hidden[:decodes].clone()

    def _reset(self, static: ForwardBatch) -> None:
        """Every row a padding row: token 0 at position 0, written to the scratch block."""
        assert static.decode_tables is not None and static.decode_context is not None
        static.token_ids.zero_()
        static.positions.zero_()
        static.slot_blocks.fill_(self.scratch_block)
        static.slot_offsets.zero_()
        static.decode_tables.zero_()
        static.decode_tables[:, 0] = self.scratch_block
        static.decode_context.fill_(1)

    def _capture(self, rows: int, width: int) -> _Captured:
        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, dtype=torch.long, device=self.device)

        static = ForwardBatch(zeros(rows), zeros(rows), [1] * rows, [1] * rows, [],
                              zeros(rows), zeros(rows), num_decodes=rows,
                              decode_tables=zeros(rows, width), decode_context=zeros(rows),
                              last_rows=torch.arange(rows, device=self.device),
                              paged=self.paged)
        self._reset(static)
        captured = _Captured(static, None)
        if self.capture:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up: kernels chosen, workspaces allocated
                    self.model(static, self.pool)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.memory_pool):
                captured.logits, captured.hidden = self.model(static, self.pool)
            captured.graph = graph
        self.graphs[(rows, width)] = captured
        return captured

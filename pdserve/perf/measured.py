"""A model x GPU x TP degree x engine priced from measured kernels (`measured_ops.py`).

One forward pass (a batch of prefill chunks and decodes) on a TP group of `tp` GPUs takes
  host(seqs, tp)                        the engine's per-step host overhead (`host_overhead`)
  + embedding(tokens) + LM head(seqs)   once per pass; the LM head a bf16 GEMM of vocab/tp
  + layers * ( 2 x add+norm, activation elementwise, as AIConfigurator prices them
               + QKV, O, gate+up, down   GEMMs on one GPU's shard, bf16 (fp8 for W8A8); in
                                         an MoE model the router's GEMM and the fused MoE
                                         layer (its activation inside) instead of the FFN
               + prefill attention       per chunk (new, prior tokens)
               + decode attention        the decodes' batch and mean context
               + 2 all-reduces of tokens x hidden x 2 bytes when tp > 1 )
which is AIConfigurator's composition of a Llama-family step (its `models/llama.py`), so
`bench/calibration.py` can set the two side by side. KV capacity follows the engine's memory
defaults (`engine_memory.py`). A KV transfer between two TP groups runs `tp` shard-to-shard
sends in parallel, one per GPU pair, each priced by the measured send/recv table.

The simulator uses the runtime `PerfModel` fitted over a grid of these step times
(`to_perf_model`, with per-size tables), as for the Vidur-calibrated model.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.perf.calibrated import FIT_GRID
from pdserve.perf.engine_memory import EngineMemory, kv_capacity_tokens
from pdserve.perf.fit import fit_perf_model
from pdserve.perf.fitted import PerfModel
from pdserve.perf.host_overhead import HostOverhead
from pdserve.perf.measured_ops import MeasuredOperators
from pdserve.perf.specs import ModelSpec, check_tp


@dataclass(frozen=True)
class Measured:
    model: ModelSpec
    tp: int
    ops: MeasuredOperators
    host: HostOverhead
    memory: EngineMemory

    def __post_init__(self) -> None:
        check_tp(self.model, self.tp)
        if self.model.experts and self.model.quantised:
            raise ValueError(f"{self.model.name}: 8-bit MoE layers are not measured here")

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token

    @property
    def kv_capacity_tokens(self) -> int:
        return kv_capacity_tokens(self.model, self.ops.gpu, self.tp, self.memory)

    # ---- parts of a pass ----
    def _per_gpu(self, value: int) -> float:
        return value / self.tp

    def gemms_s(self, tokens: int) -> float:
        """The four GEMMs of one layer for `tokens` tokens."""
        m, ops = self.model, self.ops
        dtype = "fp8" if m.quantised else "bf16"
        q, kv = self._per_gpu(m.heads * m.head_dim), self._per_gpu(m.kv_heads * m.head_dim)
        attention = (ops.gemm_s(tokens, m.hidden, q + 2 * kv, dtype)
                     + ops.gemm_s(tokens, q, m.hidden, dtype))
        if m.experts:  # the router (bf16, replicated) and the fused expert layer
            return (attention + ops.gemm_s(tokens, m.hidden, m.experts)
                    + ops.moe_s(tokens, m.hidden, m.ffn, m.experts_per_token, m.experts,
                                self.tp))
        ffn = self._per_gpu(m.ffn)
        return (attention + ops.gemm_s(tokens, m.hidden, 2 * ffn, dtype)
                + ops.gemm_s(tokens, ffn, m.hidden, dtype))

    def elementwise_s(self, tokens: int) -> float:
        """Two add+norms (2h in, 2h out) and the gated activation (2f in, f out; an MoE
        layer's is inside its fused kernel)."""
        m, b = self.model, self.model.dtype_bytes
        norms = 2 * self.ops.elementwise_s(tokens * 4 * m.hidden * b)
        if m.experts:
            return norms
        return norms + self.ops.elementwise_s(tokens * 3 * self._per_gpu(m.ffn) * b)

    def all_reduce_s(self, tokens: int) -> float:
        if self.tp == 1:
            return 0.0
        return self.ops.all_reduce_s(tokens * self.model.hidden * self.model.dtype_bytes,
                                     self.tp)

    def layer_s(self, tokens: int, chunks: list[tuple[int, int]], decodes: int,
                context_tokens: int) -> float:
        m = self.model
        q, kv = m.heads / self.tp, m.kv_heads / self.tp
        total = self.gemms_s(tokens) + self.elementwise_s(tokens) + 2 * self.all_reduce_s(tokens)
        for new, prior in chunks:
            total += self.ops.prefill_attention_s(new, prior, q, kv, m.head_dim)
        if decodes:
            total += self.ops.decode_attention_s(decodes, context_tokens, q, kv, m.head_dim)
        return total

    def once_s(self, tokens: int, seqs: int) -> float:
        """Per pass, outside the layers: host overhead, embedding, LM head."""
        m = self.model
        embedding = self.ops.elementwise_s(tokens * 2 * m.hidden * m.dtype_bytes)
        lm_head = self.ops.gemm_s(seqs, m.hidden, self._per_gpu(m.vocab))
        return self.host.time_s(seqs, self.tp) + embedding + lm_head

    def pass_s(self, chunks: list[tuple[int, int]], decodes: int = 0,
               context_tokens: int = 0) -> float:
        """One forward pass: prefill `chunks` (new, prior tokens) and `decodes` sequences
        holding `context_tokens` in all."""
        tokens = sum(new for new, _ in chunks) + decodes
        seqs = len(chunks) + decodes
        return (self.once_s(tokens, seqs)
                + self.model.layers * self.layer_s(tokens, chunks, decodes, context_tokens))

    def prefill_s(self, new_tokens: int, prior_tokens: int = 0) -> float:
        return self.pass_s([(new_tokens, prior_tokens)])

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        return self.pass_s([], batch_size, context_tokens)

    def transfer_s(self, num_bytes: int, calls: int = 1) -> float:
        """KV of `num_bytes` in `calls` calls, split over the `tp` GPU pairs of the groups."""
        per_call = num_bytes / calls / self.tp
        return calls * self.ops.send_s(per_call)

    def to_perf_model(self, max_batch_size: int = 256) -> PerfModel:
        """The simulator's runtime model fitted to these step times, with per-size tables."""
        gpu = self.ops.gpu
        source = (f"measured {self.ops.name}" if gpu.kernel_tables == gpu.name
                  else f"{self.ops.name} measured on {gpu.kernel_tables}, scaled")
        # a mixture of experts' mixed steps from its kernels' own mixed passes (the closed
        # form charged its prefill fit's intercept, the experts' weight read, again: 20-30 %
        # high). Dense models keep the closed form until the verdicts priced by it are re-run
        # (their mixed steps' P90 error would halve: docs/results/fidelity.md)
        mixed = self._mixed_pass_s if self.model.experts else None
        return fit_perf_model(
            f"{self.model.name}@{gpu.name}x{self.tp} ({source}; host {self.host.name}; "
            f"memory {self.memory.name})",
            self.prefill_s, self.decode_step_s, self.transfer_s, self.kv_bytes_per_token,
            self.kv_capacity_tokens, FIT_GRID, max_batch_size, size_tables=True,
            mixed_s=mixed)

    def _mixed_pass_s(self, chunk_tokens: int, decodes: int, context_tokens: int) -> float:
        return self.pass_s([(chunk_tokens, 0)], decodes, context_tokens)

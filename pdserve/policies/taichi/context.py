"""What TaiChi's components share: the layout, the SLOs, and the decodes Alg. 1 follows.

Alg. 1 needs, per running decode, its current output length and TPOT *since its counters
were last reset* (a backflow resets them, TaiChi sec. 3.3 stage 3), and whether a migration
of it is still under way. The decode router registers every decode it places; a decode's
instance is `Request.decode_instance`, which both drivers keep current. A migration is
settled once the request is on its target and has emitted a token since it was seen there
(before that its KV may still be on the wire, and the source may still hold it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pdserve.cluster.events import ClusterView
from pdserve.perf.fitted import PerfModel
from pdserve.policies.taichi.settings import TaiChiLayout, TaiChiSettings
from pdserve.types import SLO, Request

STALE_MIGRATION_TICKS = 20  # a migration not applied by then (the request was preempted or
# left the source another way) stops blocking the request


@dataclass(slots=True)
class DecodeTrack:
    request: Request
    ref_s: float  # TPOT counters: time and output length at the last reset
    ref_tokens: int
    target: int = -1  # a migration to this instance is under way
    backflow: bool = False  # that migration is a backflow (resets the counters when settled)
    seen_on_target_tokens: int = -1  # output length when first seen on the target
    pending_ticks: int = 0

    @property
    def output_since_reset(self) -> int:
        return self.request.generated_tokens - self.ref_tokens

    def tpot_since_reset_s(self) -> float:
        """Mean time per output token since the counters were reset (0 with no token yet)."""
        tokens = self.request.generated_tokens - self.ref_tokens
        if tokens <= 0:
            return 0.0
        return (self.request.last_token_s - self.ref_s) / tokens


@dataclass
class TaiChiContext:
    layout: TaiChiLayout
    settings: TaiChiSettings
    slo: SLO
    perf: PerfModel
    max_batch_size: int  # sequences per instance batch (the local scheduler's cap)
    decodes: dict[int, DecodeTrack] = field(default_factory=dict)  # by request id

    def use_perf_model(self, perf: PerfModel) -> None:
        self.perf = perf  # read at each estimate; the tracked decodes are kept

    def track(self, request: Request) -> None:
        """A decode starts: TPOT counts from the first token (the metric's definition)."""
        first = request.first_token_s
        self.decodes[request.request_id] = DecodeTrack(
            request, first if first == first else request.arrival_s, 1)

    def start_migration(self, track: DecodeTrack, target: int, backflow: bool) -> None:
        track.target, track.backflow = target, backflow
        track.seen_on_target_tokens, track.pending_ticks = -1, 0

    def refresh(self, view: ClusterView) -> None:
        """Forget ended decodes; settle migrations that took effect (once per tick)."""
        ended = [rid for rid, t in self.decodes.items()
                 if t.request.finished or t.request.rejected_reason]
        for rid in ended:
            del self.decodes[rid]
        for track in self.decodes.values():
            if track.target >= 0:
                self._settle(track)

    @staticmethod
    def _settle(track: DecodeTrack) -> None:
        request = track.request
        track.pending_ticks += 1
        if request.decode_instance != track.target:
            if track.pending_ticks >= STALE_MIGRATION_TICKS:
                track.target = -1  # never applied
            return
        if track.seen_on_target_tokens < 0:
            track.seen_on_target_tokens = request.generated_tokens
            return
        if request.generated_tokens > track.seen_on_target_tokens:
            if track.backflow:  # "logically treated as a new request" (sec. 3.3)
                track.ref_s = request.last_token_s
                track.ref_tokens = request.generated_tokens
            track.target = -1

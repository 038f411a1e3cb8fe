"""TaiChi's flowing decode scheduling (TaiChi sec. 3.3 stages 2 and 3, Algorithm 1).

On every monitor tick (the paper runs it every iteration; pdserve's global scheduler acts on
ticks, so the tick interval bounds how late a decision comes):
  P-heavy instance (Alg. 1 lines 1-3): every decode there whose TPOT since its counters were
    last reset exceeds alpha x TPOT SLO flows back to a D-heavy instance (backflow); its
    counters reset once it has arrived ("logically treated as a new request").
  D-heavy instance (lines 4-12): while its use minus what is already chosen to leave is
    above the watermark M, the decode with the longest output since its last reset is
    degraded to a P-heavy instance (longest-first degradation). "Use" is the larger of the
    KV memory fraction (the paper's m) and the batch-slot fraction (decodes over the
    batch-size cap): M exists so that a new decode can always be accepted (sec. 3.3), and a
    full batch refuses one as surely as full memory does (pdserve's addition; with the
    calibrated A100 models a D-heavy instance reaches the 256-sequence cap before 95 % KV).
Chosen decodes are spread over the targets by load: each goes to the target with the least
KV in use counting the decodes already sent there in this tick (backflow: D-heavy; degrade:
P-heavy that take decodes with room for it). Each becomes a `Migrate` action, so the move
pays the KV transfer on the cluster's links and follows the drivers' migration path; each
carries its reason (`Migrate.reason`).
"""

from __future__ import annotations

from pdserve.cluster.actions import Action, Migrate
from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.stats import InstanceLoad
from pdserve.policies.taichi.context import DecodeTrack, TaiChiContext
from pdserve.types import KV_BLOCK_TOKENS, blocks_for


class FlowingDecode:
    def __init__(self, context: TaiChiContext) -> None:
        self.context = context
        self.backflows = 0
        self.degradations = 0

    def on_tick(self, view: ClusterView, board: RoleBoard) -> list[Action]:
        context = self.context
        if not context.settings.flowing_decode or not context.layout.differentiated:
            return []
        context.refresh(view)
        by_instance: dict[int, list[DecodeTrack]] = {}
        for track in context.decodes.values():
            if track.target < 0:
                by_instance.setdefault(track.request.decode_instance, []).append(track)
        layout = context.layout
        extra_blocks = dict.fromkeys(range(len(view.instances)), 0)  # sent this tick
        actions: list[Action] = []
        for instance, tracks in sorted(by_instance.items()):
            if instance < 0 or not board.is_live(instance):
                continue
            if layout.is_p_heavy(instance):
                chosen = self.backflow_set(tracks)
                targets = [i for i in board.decode_candidates if not layout.is_p_heavy(i)]
                actions += self._send(chosen, instance, targets, view, extra_blocks, True)
            else:
                targets = [i for i in board.decode_candidates if layout.is_p_heavy(i)]
                if targets:
                    chosen = self.degrade_set(tracks, view.instances[instance])
                    actions += self._send(chosen, instance, targets, view, extra_blocks,
                                          False)
        return actions

    def backflow_set(self, tracks: list[DecodeTrack]) -> list[DecodeTrack]:
        """Alg. 1 line 2: decodes whose TPOT approaches the SLO."""
        limit_s = self.context.settings.alpha * self.context.slo.tpot_s
        return [t for t in tracks if t.tpot_since_reset_s() > limit_s]

    def degrade_set(self, tracks: list[DecodeTrack], load: InstanceLoad) -> list[DecodeTrack]:
        """Alg. 1 lines 5-11: the longest outputs until use is at most M."""
        watermark = self.context.settings.watermark
        block_limit = watermark * load.total_blocks
        slot_limit = watermark * self.context.max_batch_size
        blocks, slots = load.used_blocks, load.running_decodes + load.decode_queue_len
        chosen: list[DecodeTrack] = []
        ordered = sorted(tracks, key=lambda t: (-t.output_since_reset, t.request.request_id))
        for track in ordered:
            if blocks <= block_limit and slots <= slot_limit:
                break
            chosen.append(track)
            blocks -= blocks_for(track.request.sequence_tokens)
            slots -= 1
        return chosen

    def _send(self, chosen: list[DecodeTrack], source: int, targets: list[int],
              view: ClusterView, extra_blocks: dict[int, int], backflow: bool) -> list[Action]:
        actions: list[Action] = []
        limit_s = self.context.settings.alpha * self.context.slo.tpot_s
        for track in chosen:
            request = track.request
            need = blocks_for(request.sequence_tokens)
            best, best_blocks = -1, 0
            for i in targets:
                load = view.instances[i]
                used = blocks_for(load.running_tokens + load.decode_queue_tokens) \
                    + extra_blocks[i]
                if not backflow and load.used_blocks + extra_blocks[i] + need \
                        > load.total_blocks:
                    continue  # degrading must not overflow the P-heavy instance
                if best < 0 or used < best_blocks:
                    best, best_blocks = i, used
            if best < 0:
                continue
            extra_blocks[best] += need
            self.context.start_migration(track, best, backflow)
            if backflow:
                self.backflows += 1
                reason = (f"taichi alg1 backflow: TPOT {track.tpot_since_reset_s() * 1e3:.1f}"
                          f" ms over {track.output_since_reset} tokens > alpha x SLO "
                          f"{limit_s * 1e3:.1f} ms on P-heavy {source} -> D-heavy {best}")
            else:
                self.degradations += 1
                load = view.instances[source]
                reason = (f"taichi alg1 degrade: D-heavy {source} KV use "
                          f"{load.used_blocks / load.total_blocks:.1%}, batch "
                          f"{load.running_decodes + load.decode_queue_len}/"
                          f"{self.context.max_batch_size} > M "
                          f"{self.context.settings.watermark:.0%}; longest output "
                          f"({track.output_since_reset} tokens, "
                          f"{request.sequence_tokens // KV_BLOCK_TOKENS} blocks) -> "
                          f"P-heavy {best}")
            actions.append(Migrate(request, source, best, reason))
        return actions

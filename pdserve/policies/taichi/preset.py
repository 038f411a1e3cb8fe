"""The `taichi` preset: differentiated instances and TaiChi's two algorithms, composed.

  roles           `TaiChiRoles`: the layout's roles, fixed (the sliders decide them, sec. 3.1)
  prefill router  `TaiChiPrefillRouter` (Algorithm 2, length-aware prefill)
  decode router   `TaiChiDecodeRouter` (Algorithm 1 stage 1, low-interference start)
  rebalancer      `FlowingDecode` (Algorithm 1 stages 2-3, degradation and backflow)
  chunk sizes     S_P on P-heavy instances, S_D on D-heavy ones (`Policy.chunk_sizes_tokens`,
                  applied by both drivers as `SetChunkSize` before the first request)
"""

from __future__ import annotations

from pdserve.cluster.actions import Action
from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.perf.fitted import PerfModel
from pdserve.policies.base import Policy
from pdserve.policies.search import Knob, SearchSpace
from pdserve.policies.taichi.context import TaiChiContext
from pdserve.policies.taichi.decode_router import TaiChiDecodeRouter
from pdserve.policies.taichi.flowing_decode import FlowingDecode
from pdserve.policies.taichi.prefill_router import TaiChiPrefillRouter
from pdserve.policies.taichi.settings import TaiChiLayout, TaiChiSettings
from pdserve.types import SLO, Role


class TaiChiRoles:
    def __init__(self, layout: TaiChiLayout) -> None:
        self.layout = layout

    def initial_roles(self, num_instances: int) -> list[Role]:
        if num_instances != len(self.layout.roles):
            raise ValueError(f"taichi's layout has {len(self.layout.roles)} instances, the "
                             f"cluster {num_instances}")
        return list(self.layout.roles)

    def on_tick(self, view: ClusterView, board: RoleBoard) -> list[Action]:
        return []

    def on_progress(self, instance_id: int, view: ClusterView, board: RoleBoard) -> None:
        return None


def build_taichi(perf: PerfModel, slo: SLO, p_heavy: int, d_heavy: int,
                 settings: TaiChiSettings, max_batch_size: int) -> tuple[Policy, int]:
    """The policy for R_PD = p_heavy : d_heavy and the other sliders in `settings`, on
    instances batching at most `max_batch_size` sequences."""
    layout = TaiChiLayout.of(p_heavy, d_heavy, settings)
    context = TaiChiContext(layout, settings, slo, perf, max_batch_size)
    policy = Policy(name="taichi", prefill_router=TaiChiPrefillRouter(context),
                    decode_router=TaiChiDecodeRouter(context), role_manager=TaiChiRoles(layout),
                    rebalancer=FlowingDecode(context),
                    chunk_sizes_tokens=layout.chunk_sizes_tokens)
    return policy, len(layout.roles)


# what `pdserve plan` searches: the sliders R_PD (the split), S_P and S_D
# (`pdserve.planning.taichi.slider_grid`: aggregation, disaggregation and the hybrids between)
SEARCH_SPACES = (
    SearchSpace("taichi", "taichi", "TaiChi", "taichi", knobs=(
        Knob("policy.taichi.chunk_p_tokens", (1024, 2048, 4096),
             "S_P: larger prefills faster on P-heavy instances, stalls their decodes longer"),
        Knob("policy.taichi.chunk_d_tokens", (0, 128, 512),
             "S_D: 0 is disaggregation; larger lets D-heavy instances take more prefill")),
        chunk_sizes=()),
)

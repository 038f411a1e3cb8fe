"""What AMPD's deployment planner plans for (`PlanInputs`: model, GPU and the performance
source that prices it, GPUs to deploy on, SLOs, session workload and its rate), and the
sessions a simulated replica carries.

Shared by the per-replica latency search (`ampd.py`) and the whole-cluster check of the
ILP's shortlist (`ampd_verify.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.config import Config
from pdserve.perf.fitted import PerfModel
from pdserve.perf.host_overhead import DEFAULT_HOST_OVERHEAD
from pdserve.perf.presets import perf_model
from pdserve.policies.ampd.settings import AmpdSettings
from pdserve.sim.records import SimSettings
from pdserve.sim.runner import sim_settings
from pdserve.types import SLO
from pdserve.workload.sessions import is_session_workload, session_workload
from pdserve.workload.workload import Workload

STEADY_S = 20.0  # a replica's sessions arrive over at least this long (up to the cap),
MAX_SESSION_FACTOR = 4  # so a busy replica reaches its steady state, not a short burst


@dataclass(frozen=True)
class PlanInputs:
    model: str
    gpu: str
    gpus: int
    slo: SLO
    workload: str
    sessions: int  # simulated per replica
    rate_sps: float  # sessions started per second, whole cluster
    seed: int = 0
    ampd: AmpdSettings = AmpdSettings()  # alpha, beta and window of the verified clusters
    backend: str | None = None  # the performance source (`perf.backend`; None: the default)
    host_overhead: str = DEFAULT_HOST_OVERHEAD  # `perf.host_overhead`

    def perf(self, degree: int) -> PerfModel:
        """The model at tensor-parallel `degree` on the GPU, priced by the inputs' source."""
        return perf_model(self.model, self.gpu, degree, self.backend, self.host_overhead)


def replica_sim_settings() -> SimSettings:
    """The simulator's settings of the planner's runs: the default config's instances and
    monitor, with KV transfers priced by block alignment (`sim.transfer_mode: aligned`)."""
    return sim_settings(Config().with_values({"sim.transfer_mode": "aligned"}))


def replica_workload(inputs: PlanInputs, replicas: int) -> Workload:
    if not is_session_workload(inputs.workload):
        raise ValueError(f"the ampd planner needs a session workload (sharegpt-sessions, "
                         f"mooncake-sessions, agent:<kind>), got {inputs.workload!r}")
    rate = inputs.rate_sps / replicas
    sessions = min(max(inputs.sessions, round(rate * STEADY_S)), MAX_SESSION_FACTOR
                   * inputs.sessions)
    workload = session_workload(inputs.workload, sessions, rate, inputs.seed)
    if inputs.workload == "mooncake-sessions":  # a fixed trace: thin it by rate instead
        workload = workload.scaled(1 / replicas)
    return workload

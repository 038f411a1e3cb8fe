"""Arrow's shared context for its preset (`arrow`) and for any preset that takes one of
its routers: the TTFT predictor profiled on the performance model (sec. 4.2), the
instance monitor, and Max Running Tokens (the decode pool's TPOT bound), shared by the
prefill router (Alg. 1), the decode router (Alg. 2) and the elastic pools (Alg. 3-4)."""

from __future__ import annotations

from pdserve.cluster.monitor import InstanceMonitor
from pdserve.policies.arrow.context import ArrowContext
from pdserve.policies.arrow.profiling import TtftPredictor, max_running_tokens, profile_ttft
from pdserve.policies.setup import PolicySetup


def arrow_context(setup: PolicySetup) -> ArrowContext:
    samples = profile_ttft(setup.perf, setup.chunk_size_tokens)
    return ArrowContext(
        ttft_slo_s=setup.slo.ttft_s, tpot_slo_s=setup.slo.tpot_s,
        predictor=TtftPredictor.fit(samples), monitor=InstanceMonitor(setup.monitor_window_s),
        max_running_tokens=max_running_tokens(setup.perf, setup.slo.tpot_s,
                                              setup.max_batch_size),
        max_batch_size=setup.max_batch_size, min_dwell_s=setup.policy.arrow.min_dwell_s,
        monitor_cooldown_s=setup.policy.arrow.monitor_cooldown_s)

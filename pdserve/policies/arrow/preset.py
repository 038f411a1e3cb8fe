"""Arrow's shared context for its preset (`arrow`) and for any preset that takes one of
its routers: the TTFT predictor profiled on the performance model (sec. 4.2), the
instance monitor, and Max Running Tokens (the decode pool's TPOT bound), shared by the
prefill router (Alg. 1), the decode router (Alg. 2) and the elastic pools (Alg. 3-4)."""

from __future__ import annotations

from functools import partial

from pdserve.cluster.monitor import InstanceMonitor
from pdserve.policies.arrow.context import ArrowContext
from pdserve.policies.arrow.profiling import profiled_terms
from pdserve.policies.search import Knob, SearchSpace
from pdserve.policies.setup import PolicySetup


def arrow_context(setup: PolicySetup) -> ArrowContext:
    derive_terms = partial(profiled_terms, chunk_size_tokens=setup.chunk_size_tokens,
                           tpot_slo_s=setup.slo.tpot_s, max_batch_size=setup.max_batch_size)
    predictor, max_running_tokens = derive_terms(setup.perf)
    return ArrowContext(
        ttft_slo_s=setup.slo.ttft_s, tpot_slo_s=setup.slo.tpot_s,
        predictor=predictor, monitor=InstanceMonitor(setup.monitor_window_s),
        max_running_tokens=max_running_tokens,
        max_batch_size=setup.max_batch_size, min_dwell_s=setup.policy.arrow.min_dwell_s,
        monitor_cooldown_s=setup.policy.arrow.monitor_cooldown_s,
        derive_terms=derive_terms, perf=setup.perf)


# why Arrow's pools share one degree in a plan: a flipped instance keeps its degree, so a
# deployment with a TP-2 prefill pool and a TP-4 decode pool is a real one, but after its
# first flip each pool mixes degrees, and Arrow's context holds one TTFT predictor and one
# Max Running Tokens, profiled on one instance's model (`arrow_context`: `setup.perf`, the
# first group's), which would misprice every instance of the other degree (sec. 4.2 profiles
# one instance type: the paper's instances are interchangeable)
ONE_DEGREE = ("Arrow's instances flip pools and keep their degree; its one TTFT predictor "
              "and one Max Running Tokens (sec. 4.2) price every instance as the first")

# what `pdserve plan` searches (`pdserve.policies.search`): the P:D split Arrow starts from,
# and how long a flipped instance stays put
SEARCH_SPACES = (
    SearchSpace("arrow", "arrow", "Arrow", "disaggregated", knobs=(
        Knob("policy.arrow.min_dwell_s", (2.0, 5.0, 15.0),
             "short: pools follow bursts; long: fewer flips that a window's noise causes"),),
        chunk_sizes=(2048, 8192), one_degree=ONE_DEGREE),
)

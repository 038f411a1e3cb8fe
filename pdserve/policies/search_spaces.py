"""Every search space `pdserve plan` can search, by name: each paper's (declared beside its
preset, `SEARCH_SPACES` in `policies/<paper>/preset.py`), the generic presets', and the
compositions across papers, which are candidates like any other. `CANNOT_COMPOSE` lists the
components that do not compose and why (`tests/test_plan.py` builds every space and
checks that each listed config fails to build, for the reason given).
"""

from __future__ import annotations

from pdserve.policies.ampd.preset import SEARCH_SPACES as AMPD
from pdserve.policies.ares.preset import SEARCH_SPACES as ARES
from pdserve.policies.arrow.preset import ONE_DEGREE as ARROW_ONE_DEGREE
from pdserve.policies.arrow.preset import SEARCH_SPACES as ARROW
from pdserve.policies.flowkv.preset import SEARCH_SPACES as FLOWKV
from pdserve.policies.search import CannotCompose, Knob, SearchSpace
from pdserve.policies.taichi.preset import SEARCH_SPACES as TAICHI

_COLOCATED_CHUNKS = (256, 512, 1024, 2048, 4096)
_DISAGGREGATED_CHUNKS = (2048, 8192)

GENERIC = (
    SearchSpace("colocated", "colocated", "", "colocated", chunk_sizes=_COLOCATED_CHUNKS),
    SearchSpace("static-pd", "static-pd", "", "disaggregated",
                chunk_sizes=_DISAGGREGATED_CHUNKS, same_as=("min-load", "vllm")),
    SearchSpace("round-robin", "round-robin", "", "disaggregated",
                chunk_sizes=_DISAGGREGATED_CHUNKS),
    SearchSpace("continuum", "continuum", "", "colocated", chunk_sizes=_COLOCATED_CHUNKS,
                sessions_only=True),
)

# compositions no single paper proposed; each is a config of existing components
COMPOSITIONS = (
    # Arrow's elastic pools, with ARES's decode rebalancing inside the decode pool
    SearchSpace("arrow+ares", "arrow", "Arrow + ARES", "disaggregated", knobs=(
        Knob("policy.arrow.min_dwell_s", (5.0, 15.0), "as arrow's"),
        Knob("policy.ares.theta", (0.1, 0.2), "as ares's")),
        chunk_sizes=_DISAGGREGATED_CHUNKS, fixed={"policy.rebalancer": "ares"},
        one_degree=ARROW_ONE_DEGREE),
    # Arrow's SLO-aware dispatch (Alg. 1-2) on fixed pools, ARES rebalancing the decodes
    SearchSpace("static-pd+arrow-routers+ares", "static-pd", "Arrow + ARES", "disaggregated",
                knobs=(Knob("policy.ares.theta", (0.1, 0.2), "as ares's"),),
                chunk_sizes=_DISAGGREGATED_CHUNKS,
                fixed={"policy.prefill_router": "arrow", "policy.decode_router": "arrow",
                       "policy.rebalancer": "ares"},
                one_degree="Arrow's routers price every instance by one predictor and one "
                           "Max Running Tokens, profiled on the first instance's model"),
    # FlowKV's load-aware scenarios and reserve, ARES moving decodes between its D instances
    SearchSpace("flowkv+ares", "flowkv", "FlowKV + ARES", "disaggregated",
                knobs=(Knob("cluster.reserve", (0, 1), "as flowkv's"),),
                chunk_sizes=_DISAGGREGATED_CHUNKS, fixed={"policy.rebalancer": "ares"}),
    # AMPD's session binding and reordering with ARES's rebalancer
    SearchSpace("ampd+ares", "ampd", "AMPD + ARES", "disaggregated",
                chunk_sizes=_DISAGGREGATED_CHUNKS, fixed={"policy.rebalancer": "ares"}),
    # fixed pools whose decode router places each prefilled request by its predicted KV
    # peak (ARES sec. 3's motivation; the rule is pdserve's, `policies/ares/dispatch.py`),
    # with the workers' `history` predictor, as a server runs it
    SearchSpace("static-pd+predicted-dispatch", "static-pd", "ARES sec. 3 (pdserve's rule)",
                "disaggregated", chunk_sizes=_DISAGGREGATED_CHUNKS,
                fixed={"policy.decode_router": "predicted-load"}),
    # the same dispatch under ARES's rebalancer: fewer imbalances for Alg. 1 to repair
    SearchSpace("ares+predicted-dispatch", "ares", "ARES", "disaggregated",
                knobs=(Knob("policy.ares.theta", (0.1, 0.2), "as ares's"),),
                chunk_sizes=_DISAGGREGATED_CHUNKS,
                fixed={"policy.decode_router": "predicted-load"}),
)

SEARCH_SPACES: dict[str, SearchSpace] = {
    space.name: space for space in (*GENERIC, *ARROW, *TAICHI, *FLOWKV, *ARES, *AMPD,
                                    *COMPOSITIONS)}


CANNOT_COMPOSE = (
    CannotCompose("taichi", "ARES rebalancer",
                  "taichi's flowing decode (Alg. 1) is its rebalancer; ARES cannot replace it",
                  {"policy.name": "taichi", "policy.rebalancer": "ares"}),
    CannotCompose("taichi", "another preset's routers",
                  "taichi's routers (Alg. 2 and 1) share per-request state through its "
                  "context and cannot be replaced; TaiChi's chunk profiles under FlowKV's "
                  "routing is therefore not a config",
                  {"policy.name": "taichi", "policy.prefill_router": "min-load"}),
    CannotCompose("flowkv routers", "another preset",
                  "FlowKV's routers read the status vectors of its own context, which only "
                  "the flowkv preset builds; they are not in the router tables",
                  {"policy.name": "static-pd", "policy.prefill_router": "flowkv"}),
    CannotCompose("AMPD reordering (Alg. 2)", "another preset",
                  "the queue order is not a config field: Alg. 2 comes with the ampd "
                  "presets only"),
    CannotCompose("predicted-load dispatch", "the reschedule-current rebalancer",
                  "the dispatch reads the instances' predicted load, and reschedule-current "
                  "makes them keep only their current load",
                  {"policy.name": "reschedule-current",
                   "policy.decode_router": "predicted-load"}),
    CannotCompose("reserve instances", "any preset but flowkv",
                  "only FlowKV's role manager scales from a reserve",
                  {"policy.name": "static-pd", "cluster.instances": "1xh800:prefill,"
                   "1xh800:decode,1xh800:reserve"}),
)

def spaces_for(policy: str, sessions: bool) -> list[SearchSpace]:
    """The spaces `pdserve plan --policy POLICY` searches: `all` (those that fit the
    workload: the session-only ones on session workloads), or spaces by name, comma-separated
    (a preset with the same composition as a space names that space)."""
    if policy == "all":
        return [s for s in SEARCH_SPACES.values() if sessions or not s.sessions_only]
    aliases = {alias: s.name for s in SEARCH_SPACES.values() for alias in s.same_as}
    spaces = []
    for name in (n.strip() for n in policy.split(",")):
        name = aliases.get(name, name)
        if name not in SEARCH_SPACES:
            raise ValueError(f"no search space {name!r}; known: all, "
                             f"{', '.join(SEARCH_SPACES)}")
        spaces.append(SEARCH_SPACES[name])
    return spaces

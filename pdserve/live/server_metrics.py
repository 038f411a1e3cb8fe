"""Every Prometheus metric of the live server, defined here and exposed through
`prometheus_client` (one registry per server).

Where pdserve measures what vLLM measures, the name and labels are vLLM's (its v1 engine's:
`model_name` on every family, `engine` for the instance), so vLLM's Grafana dashboard and
alerts read pdserve too: `vllm:time_to_first_token_seconds`,
`vllm:inter_token_latency_seconds`, `vllm:request_time_per_output_token_seconds`,
`vllm:e2e_request_latency_seconds`, `vllm:prompt_tokens_total`,
`vllm:generation_tokens_total`, `vllm:request_success_total{finished_reason}`,
`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`,
`vllm:num_preemptions_total`. What only an adaptive PD cluster has carries the `pdserve:`
prefix: roles and pools, flips, KV hand-offs and migrations with their bytes, rejections
and failures by reason, worker failures, restarts, starts and stops.

`ServerMetrics` owns the registry: the driver and its collaborators count and observe
through it as things happen; the per-instance gauges are read at scrape time from the
driver's `ClusterGauges` (its workers' latest load reports, which workers send after every
step and, when idle, whenever their load changed). Per-instance cumulative counters
(`vllm:num_preemptions_total`) restart from 0 with their worker, which Prometheus reads as
a counter reset. `deploy/grafana/pdserve.json` charts these names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from pdserve.cluster.history import InstanceState
from pdserve.instance.stats import InstanceLoad
from pdserve.live.processes import WorkerPlacement
from pdserve.types import Role

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0,
                  80.0, 160.0, 640.0)
TOKEN_GAP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                       2.5, 5.0, 10.0, 20.0)
E2E_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 240.0, 480.0,
                 960.0)
FAILURE_REASONS = ("invalid_request", "engine_error", "worker_crash", "retry_budget",
                   "no_instance", "overloaded", "shutdown")
# why a request was refused: the server's admission limit, the policy's early rejection
# under load, no live instance for a phase, or a request no instance can ever hold
REJECTION_REASONS = ("max_outstanding", "overloaded", "no_instance", "cannot_fit")
TRANSFER_KINDS = ("handoff", "migration")


@dataclass(frozen=True)
class ClusterGauges:
    """What the per-instance gauges read at a scrape: each instance's role, state and
    latest load (indexed by instance), and the requests in flight."""

    roles: Sequence[Role]
    states: Sequence[InstanceState]
    loads: Sequence[InstanceLoad]
    requests_in_flight: int
    # workers on a Ray cluster: each instance's node and whether its (re)start waits for
    # resources (`WorkerProcesses.placements`); empty for local worker processes
    placements: Sequence[WorkerPlacement] = ()


class ServerMetrics:
    """The live server's metrics. `model_name`: the served model's name (the `model_name`
    label); `gauges`: the driver's current `ClusterGauges`, read at every scrape."""

    def __init__(self, model_name: str, gauges: Callable[[], ClusterGauges]) -> None:
        # no `*_created` series (a process-wide switch of the library, as vLLM sets it):
        # Prometheus and Grafana read counters without them
        disable_created_metrics()
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        registry, model = self.registry, ["model_name"]

        def counter(name: str, text: str, labels: Sequence[str] = ()) -> Counter:
            made = Counter(name, text, [*model, *labels], registry=registry)
            if not labels:
                made.labels(model_name)  # exported from the start, at 0
            return made

        def histogram(name: str, text: str, buckets: Sequence[float]) -> Histogram:
            made = Histogram(name, text, model, buckets=buckets, registry=registry)
            made.labels(model_name)
            return made

        # vLLM's names, where pdserve measures the same thing
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds (arrival at the "
                              "server to the first token streamed).", TTFT_BUCKETS_S)
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", TOKEN_GAP_BUCKETS_S)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time per output token in seconds: (last - first "
                              "token) / (tokens - 1), per request.", TOKEN_GAP_BUCKETS_S)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of end to end request latency in seconds.",
                             E2E_BUCKETS_S)
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens "
                                     "processed (counted once per request).")
        self.generation_tokens = counter("vllm:generation_tokens",
                                         "Number of generation tokens streamed to clients.")
        self.successes = counter("vllm:request_success", "Count of successfully processed "
                                 "requests, by finish reason.", ["finished_reason"])
        # pdserve's own
        self.requests = counter("pdserve:requests", "Requests admitted.")
        self.rejections = counter("pdserve:rejections", "Requests refused, by reason: "
                                  "max_outstanding (the server's admission limit), overloaded "
                                  "(the policy's early rejection), no_instance (no live "
                                  "instance for a phase), cannot_fit (no instance can hold "
                                  "it).", ["reason"])
        self.failures = counter("pdserve:requests_failed", "Requests that ended with an "
                                "error, by reason.", ["reason"])
        self.cancellations = counter("pdserve:cancellations", "Requests cancelled by their "
                                     "client.")
        self.retries = counter("pdserve:retries", "Re-runs of requests whose worker died.")
        self.resumed_tokens = counter("pdserve:resumed_tokens", "Streamed tokens that re-runs "
                                      "resumed after rather than generated.")
        self.handoffs = counter("pdserve:kv_handoffs", "KV hand-offs from a prefill to a "
                                "decode instance.")
        self.migrations = counter("pdserve:migrations", "Running decodes moved between "
                                  "instances with their KV.")
        self.transfer_bytes = counter("pdserve:kv_transfer_bytes", "KV bytes moved between "
                                      "instances, by kind (handoff, migration).", ["kind"])
        self.flips = counter("pdserve:role_flips", "Instance role changes, by the new role.",
                             ["role"])
        self.worker_failures = counter("pdserve:worker_failures", "Worker processes that "
                                       "exited unexpectedly.")
        self.worker_restarts = counter("pdserve:worker_restarts", "Worker processes started "
                                       "again after an exit.")
        self.instance_starts = counter("pdserve:instance_starts", "Stopped instances started "
                                       "on the policy's request (elastic scaling).")
        self.instance_stops = counter("pdserve:instance_stops", "Instances stopped on the "
                                      "policy's request (drained, or a reserve).")
        for reason in FAILURE_REASONS:  # every series exists from the start, at 0
            self.failures.labels(model_name, reason)
        for reason in REJECTION_REASONS:
            self.rejections.labels(model_name, reason)
        for kind in TRANSFER_KINDS:
            self.transfer_bytes.labels(model_name, kind)
        for role in Role:
            self.flips.labels(model_name, role.value)
        for reason in ("stop", "length", "abort"):
            self.successes.labels(model_name, reason)
        registry.register(_ClusterCollector(model_name, gauges))

    def count_ignored_fields(self, total: Callable[[], int]) -> None:
        """Expose `total()`, the unknown request-body fields the HTTP layer ignored."""
        self.registry.register(_IgnoredFields(self.model_name, total))

    # ---- counting (one call per thing that happened) ----
    def add(self, metric: Counter, amount: float = 1.0, *labels: str) -> None:
        metric.labels(self.model_name, *labels).inc(amount)

    def observe(self, metric: Histogram, value_s: float) -> None:
        metric.labels(self.model_name).observe(value_s)

    def total(self, name: str, **labels: str) -> float:
        """A counter's value now, summed over the label values not given
        (`total("pdserve:rejections", reason="overloaded")`)."""
        found = 0.0
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name == f"{name}_total" and all(
                        sample.labels.get(k) == v for k, v in labels.items()):
                    found += sample.value
        return found

    def text(self) -> bytes:
        """The Prometheus text exposition of every metric (`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


class _ClusterCollector(Collector):
    """The per-instance and pool gauges, read from the driver at each scrape."""

    def __init__(self, model_name: str, gauges: Callable[[], ClusterGauges]) -> None:
        self.model_name = model_name
        self.gauges = gauges

    def describe(self) -> Iterator[Metric]:
        return iter(())  # families are built at collect time

    def collect(self) -> Iterator[Metric]:
        now, model = self.gauges(), self.model_name
        live = [x for x in now.loads if now.states[x.instance_id] is InstanceState.UP]

        def per_instance(name: str, text: str, value: Callable[[InstanceLoad], float],
                         kind: type[Metric] = GaugeMetricFamily) -> Metric:
            family = kind(name, text, labels=["model_name", "engine"])
            for load in live:
                family.add_metric([model, str(load.instance_id)], float(value(load)))
            return family

        yield per_instance("vllm:num_requests_running", "Number of requests in model "
                           "execution batches (decoding, or prefilling), per live instance.",
                           lambda x: x.running_decodes + x.prefill_running_len)
        yield per_instance("vllm:num_requests_waiting", "Number of requests waiting for a "
                           "prefill slot, their KV or a decode slot, per live instance.",
                           lambda x: max(0, x.prefill_queue_len - x.prefill_running_len)
                           + x.decode_queue_len)
        yield per_instance("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent "
                           "usage, per live instance (as vLLM counts it: cached KV that a "
                           "request short of memory would evict, here session history kept "
                           "for later rounds, is free).",
                           lambda x: (x.used_blocks - x.reclaimable_blocks) / x.total_blocks
                           if x.total_blocks else 0.0)
        yield per_instance("vllm:num_preemptions", "Cumulative number of preemptions (KV "
                           "dropped, recomputed later), per live instance since its worker "
                           "started.", lambda x: x.preemptions_total, CounterMetricFamily)
        yield per_instance("pdserve:prefill_queue_len", "Requests waiting for or in prefill, "
                           "per live instance.", lambda x: x.prefill_queue_len)
        yield per_instance("pdserve:decode_queue_len", "Decodes waiting for their KV or a "
                           "batch slot, per live instance.", lambda x: x.decode_queue_len)
        yield per_instance("pdserve:kv_used_blocks", "KV blocks in use, per live instance, "
                           "including session history kept for later rounds.",
                           lambda x: x.used_blocks)
        yield per_instance("pdserve:kv_reclaimable_blocks", "Of the KV blocks in use, the "
                           "session history kept for later rounds that a request short of "
                           "memory would evict, per live instance.",
                           lambda x: x.reclaimable_blocks)
        yield per_instance("pdserve:kv_capacity_blocks", "KV blocks of the pool (16 tokens "
                           "each), per live instance.", lambda x: x.total_blocks)
        role = GaugeMetricFamily("pdserve:instance_role", "1 for the instance's current role, "
                                 "0 for the others.", labels=["model_name", "engine", "role"])
        state = GaugeMetricFamily("pdserve:instance_state", "1 for the instance's current "
                                  "state (up, stopped, restarting, dead), 0 for the others.",
                                  labels=["model_name", "engine", "state"])
        for instance, (current, running) in enumerate(zip(now.roles, now.states, strict=True)):
            for each in Role:
                role.add_metric([model, str(instance), each.value], float(each is current))
            for each in InstanceState:
                state.add_metric([model, str(instance), each.value], float(each is running))
        yield role
        yield state
        pools = GaugeMetricFamily("pdserve:pool_size", "Live instances in each role.",
                                  labels=["model_name", "role"])
        for each in Role:
            pools.add_metric([model, each.value], float(sum(
                1 for r, s in zip(now.roles, now.states, strict=True)
                if r is each and s is InstanceState.UP)))
        yield pools
        in_flight = GaugeMetricFamily("pdserve:requests_in_flight", "Requests admitted and "
                                      "not yet ended.", labels=["model_name"])
        in_flight.add_metric([model], float(now.requests_in_flight))
        yield in_flight
        if now.placements:
            waiting = GaugeMetricFamily(
                "pdserve:worker_waiting_for_resources", "1 while the instance's (re)start "
                "waits for a node with room for it, else 0; node_id and node_ip name the node "
                "of its live worker (empty while none is live).",
                labels=["model_name", "engine", "node_id", "node_ip"])
            for instance, placed in enumerate(now.placements):
                waiting.add_metric([model, str(instance), placed.node_id, placed.node_ip],
                                   1.0 if placed.waiting_for_resources else 0.0)
            yield waiting


class _IgnoredFields(Collector):
    def __init__(self, model_name: str, total: Callable[[], int]) -> None:
        self.model_name = model_name
        self.total = total

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        ignored = CounterMetricFamily("pdserve:ignored_request_fields", "Unknown request-body "
                                      "fields ignored (every occurrence).", labels=["model_name"])
        ignored.add_metric([self.model_name], float(self.total()))
        yield ignored

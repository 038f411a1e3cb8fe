"""Per-step host (CPU) overhead of a serving engine, with the source of every value.

A step's wall time is its kernels plus whatever host work the GPU waits for: scheduling,
preparing inputs, launching kernels, sampling, and handing outputs back.

  engine    today's engines hide it: vLLM V1 with asynchronous scheduling schedules and
            prepares step k+1 while step k runs and replays decode steps as CUDA graphs
            (docs.vllm.ai, "CUDA Graphs" and `--async-scheduling`); SGLang's overlap
            scheduler does the same (on by default, `--disable-overlap-schedule` turns it
            off); TensorRT-LLM's PyExecutor overlaps scheduling with the forward pass
            (`disable_overlap_scheduler` false by default). Each leaves the step as long as
            its kernels: 0 s per step, 0 s per sequence. AIConfigurator's step estimates,
            which this model is checked against, add none either.
  vllm-v0   2023 vLLM (v0, Ray executor) as Vidur measured it on A100 hosts: the fitted
            curve of `pdserve/data/gpu_profiles/cpu_overheads.csv` (about 1.03 ms + 47 us
            per sequence per step, plus 6.7 ms at TP > 1), `operators.CpuOverhead`
  none      no host overhead: the convention of simulators that count kernels only (TaiChi's
            Fig. 4 is a Vidur simulation counting none)
"""

from __future__ import annotations

from dataclasses import dataclass

from pdserve.perf.operators import CpuOverhead, shipped_operator_model

HOST_OVERHEADS = ("engine", "vllm-v0", "none")
DEFAULT_HOST_OVERHEAD = "engine"


@dataclass(frozen=True, slots=True)
class HostOverhead:
    name: str
    per_step_s: float = 0.0
    per_seq_s: float = 0.0
    tp_s: float = 0.0  # added once per step when the instance spans more than one GPU

    def time_s(self, seqs: int, tp: int) -> float:
        return self.per_step_s + self.per_seq_s * seqs + (self.tp_s if tp > 1 else 0.0)


def host_overhead(name: str = DEFAULT_HOST_OVERHEAD) -> HostOverhead:
    """The overhead called `name` (one of `HOST_OVERHEADS`)."""
    if name == "engine" or name == "none":
        return HostOverhead(name)
    if name == "vllm-v0":
        cpu: CpuOverhead = shipped_operator_model().cpu
        return HostOverhead(name, cpu.base_s, cpu.per_seq_s, cpu.tp_comm_s)
    raise ValueError(f"unknown host overhead {name!r}; known: {', '.join(HOST_OVERHEADS)}")

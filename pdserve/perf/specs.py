"""Model and GPU specifications for the performance models, with where each number comes from.

Model shapes are the `config.json` fields of the public Hugging Face checkpoints named in
`source`. GPU figures are vendor datasheet numbers for dense (non-sparse) 16-bit tensor math.
`link_gb_s` is the one-way bandwidth from one GPU to a peer: datasheets quote NVLink as the
two-way total (A100 600 GB/s = 300 each way), so the NVLink figures are halved here.
`memory_bytes` is the capacity engines see, in binary units: an "80 GB" H100 holds 80 GiB
(85.9e9 bytes), as AIConfigurator's `systems/*.yaml` and Vidur's memory planner count it;
where AIConfigurator lists what nvidia-smi reports (L40S 46,068 MiB for "48 GB"), that.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    dtype_bytes: int = 2  # activations and KV (16-bit)
    tied_embeddings: bool = False
    source: str = ""
    weight_bits: int = 16  # of the decoder layers' linear weights; 8: W8A8 (8-bit weights
    # and activations in the GEMMs; embeddings, LM head and KV stay 16-bit)
    experts: int = 0  # routed experts per layer (mixture of experts); 0: a dense FFN. In an
    # MoE model `ffn` is one expert's intermediate size and every layer routes each token
    # to `experts_per_token` of them (no shared expert, no dense layers: Qwen3-MoE, Mixtral)
    experts_per_token: int = 0

    @property
    def quantised(self) -> bool:
        return self.weight_bits < 16

    @property
    def layer_params(self) -> int:
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        if self.experts:  # every expert's SwiGLU, and the router
            return attention + self.experts * (3 * self.hidden * self.ffn + self.hidden)
        return attention + 3 * self.hidden * self.ffn  # q,o + k,v ; SwiGLU gate, up, down

    @property
    def params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.layers * self.layer_params + embeddings

    @property
    def weight_bytes(self) -> int:
        embeddings = self.params - self.layers * self.layer_params
        return (self.layers * self.layer_params * self.weight_bits // 8
                + embeddings * self.dtype_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    tflops: float  # dense BF16/FP16 tensor TFLOP/s
    hbm_gb_s: float
    memory_bytes: int  # total device memory as the driver reports it (what vLLM's
    # gpu_memory_utilization multiplies); AIConfigurator's `mem_capacity` where it measured
    # the GPU
    link_gb_s: float  # one-way GPU-to-peer bandwidth, for TP all-reduce and KV transfer
    interconnect: str = "nvlink"  # "nvlink" or "pcie": picks the fitted link efficiency
    source: str = ""
    int8_tops: float = 0.0  # dense 8-bit (INT8, or FP8 where faster) tensor TOP/s (W8A8
    # GEMMs); 0: twice `tflops`
    # the measured GPU whose kernel tables price this one (`perf/kernel_tables.py`): itself
    # where AIConfigurator measured it; else the nearest measured GPU of the same
    # architecture, scaled to this one's datasheet by the fitted curves (`measured_ops.py`)
    kernel_tables: str = ""

    @property
    def int8_peak_tops(self) -> float:
        return self.int8_tops or 2 * self.tflops


MODELS: dict[str, ModelSpec] = {m.name: m for m in [
    ModelSpec("llama-3.1-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
              ffn=14336, vocab=128256, source="meta-llama/Llama-3.1-8B config.json"),
    ModelSpec("llama-3.1-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
              ffn=28672, vocab=128256, source="meta-llama/Llama-3.1-70B config.json"),
    ModelSpec("deepseek-r1-distill-qwen-7b", layers=28, hidden=3584, heads=28, kv_heads=4,
              head_dim=128, ffn=18944, vocab=152064,
              source="deepseek-ai/DeepSeek-R1-Distill-Qwen-7B config.json"),
    ModelSpec("deepseek-r1-distill-qwen-7b-w8a8", layers=28, hidden=3584, heads=28,
              kv_heads=4, head_dim=128, ffn=18944, vocab=152064, weight_bits=8,
              source="deepseek-ai/DeepSeek-R1-Distill-Qwen-7B config.json, W8A8 as ARES "
              "runs it (sec. 6.1): INT8 weights and activations in the decoder GEMMs"),
    ModelSpec("qwen2.5-14b", layers=48, hidden=5120, heads=40, kv_heads=8, head_dim=128,
              ffn=13824, vocab=152064, source="Qwen/Qwen2.5-14B config.json"),
    ModelSpec("qwen2.5-32b", layers=64, hidden=5120, heads=40, kv_heads=8, head_dim=128,
              ffn=27648, vocab=152064, source="Qwen/Qwen2.5-32B config.json"),
    ModelSpec("smollm2-135m", layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64,
              ffn=1536, vocab=49152, tied_embeddings=True,
              source="HuggingFaceTB/SmolLM2-135M-Instruct config.json (pdserve's default "
              "model; for checking the simulator against a GPU, docs/results/gpu.md)"),
    # the shapes Vidur profiled (pdserve/data/gpu_profiles/), for checking the calibration
    ModelSpec("llama-2-7b", layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128,
              ffn=11008, vocab=32000, source="meta-llama/Llama-2-7b-hf config.json"),
    ModelSpec("llama-2-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
              ffn=28672, vocab=32000, source="meta-llama/Llama-2-70b-hf config.json"),
    ModelSpec("codellama-34b", layers=48, hidden=8192, heads=64, kv_heads=8, head_dim=128,
              ffn=22016, vocab=32000, source="codellama/CodeLlama-34b-Instruct-hf config.json"),
    ModelSpec("qwen-72b", layers=80, hidden=8192, heads=64, kv_heads=64, head_dim=128,
              ffn=24576, vocab=152064, source="Qwen/Qwen-72B config.json (intermediate_size "
              "49152 counts gate and up; 24576 each, as Vidur's profile lists it)"),
    ModelSpec("qwen3-32b", layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128,
              ffn=25600, vocab=151936, source="Qwen/Qwen3-32B config.json (head_dim 128 is "
              "explicit there: 64 heads x 128 != hidden 5120)"),
    # mixture of experts: priced by the measured engines' MoE tables only (`--backend vllm`,
    # sglang, trtllm), not by the Vidur model or the roofline (no MoE operators there)
    ModelSpec("qwen3-30b-a3b", layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128,
              ffn=768, vocab=151936, experts=128, experts_per_token=8,
              source="Qwen/Qwen3-30B-A3B config.json (moe_intermediate_size 768, 128 experts, "
              "8 per token, every layer sparse)"),
    ModelSpec("qwen3-235b-a22b", layers=94, hidden=4096, heads=64, kv_heads=4, head_dim=128,
              ffn=1536, vocab=151936, experts=128, experts_per_token=8,
              source="Qwen/Qwen3-235B-A22B config.json (moe_intermediate_size 1536, 128 "
              "experts, 8 per token, every layer sparse)"),
    ModelSpec("mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
              ffn=14336, vocab=32000, experts=8, experts_per_token=2,
              source="mistralai/Mixtral-8x7B-v0.1 config.json (8 local experts, 2 per token)"),
    ModelSpec("mixtral-8x22b", layers=56, hidden=6144, heads=48, kv_heads=8, head_dim=128,
              ffn=16384, vocab=32000, experts=8, experts_per_token=2,
              source="mistralai/Mixtral-8x22B-v0.1 config.json (8 local experts, 2 per token)"),
    ModelSpec("qwen3-coder-480b-a35b", layers=62, hidden=6144, heads=96, kv_heads=8,
              head_dim=128, ffn=2560, vocab=151936, experts=160, experts_per_token=8,
              source="Qwen/Qwen3-Coder-480B-A35B-Instruct config.json (moe_intermediate_size "
              "2560, 160 experts, 8 per token, every layer sparse, no shared expert)"),
]}

GPUS: dict[str, GpuSpec] = {g.name: g for g in [
    GpuSpec("h800", tflops=989.4, hbm_gb_s=3350, memory_bytes=80 * GIB, link_gb_s=200,
            source="H800 SXM5 has the H100 SXM5 compute and HBM3 (NVIDIA H100 datasheet: "
            "989.4 dense BF16 TFLOP/s, 3.35 TB/s); NVLink 400 GB/s two-way as stated in "
            "Arrow sec. 7.1, 200 GB/s each way. Priced by the H100's kernel tables, its "
            "links scaled to 200 GB/s; memory 80 GiB, as the H100", kernel_tables="h100"),
    GpuSpec("h100", tflops=989.4, hbm_gb_s=3350, memory_bytes=80 * GIB, link_gb_s=450,
            source="NVIDIA H100 SXM5 datasheet: 989.4 dense BF16 TFLOP/s, 80 GB HBM3 at "
            "3.35 TB/s, NVLink 900 GB/s two-way, 450 GB/s each way; kernel tables measured "
            "(AIConfigurator h100_sxm; its mem_capacity, 80 GiB)", int8_tops=1978,
            kernel_tables="h100"),
    GpuSpec("a100", tflops=312, hbm_gb_s=2039, memory_bytes=80 * GIB, link_gb_s=300,
            source="NVIDIA A100 80GB SXM4 datasheet: 312 dense BF16 TFLOP/s, 2,039 GB/s, "
            "NVLink 600 GB/s two-way, 300 GB/s each way. The calibration profiles (Vidur) "
            "are A100 80GB measurements; their network files are from NVLink-bridged pairs; "
            "kernel tables measured (AIConfigurator a100_sxm; its mem_capacity, 80 GiB)",
            kernel_tables="a100"),
    GpuSpec("h20", tflops=148, hbm_gb_s=4000, memory_bytes=96 * GIB, link_gb_s=450,
            source="NVIDIA H20 product brief: 148 dense BF16 TFLOP/s, 96 GB HBM3 at 4.0 TB/s, "
            "NVLink 900 GB/s two-way, 450 GB/s each way; 296 dense INT8/FP8 TOP/s. Hopper like "
            "the H100: priced by the H100's kernel tables scaled per bound (compute by "
            "148/989, memory by 4.0/3.35, links equal); 96 GB counted as 96 GiB, the way "
            "AIConfigurator counts the H100's 80 GB", int8_tops=296, kernel_tables="h100"),
    GpuSpec("l20", tflops=119.5, hbm_gb_s=864, memory_bytes=46068 * MIB, link_gb_s=32,
            interconnect="pcie",
            source="NVIDIA L20 product brief: 119.5 dense FP16/BF16 tensor TFLOP/s (239 with "
            "sparsity), 48 GB GDDR6 at 864 GB/s (384-bit at 2.25 GHz), no NVLink, PCIe 4.0 "
            "x16 32 GB/s each way; AD102 with 92 SMs at 2,520 MHz boost, cross-checked on "
            "spec listings (technical.city, topcpu.net): 119.5 = the L40's 181 dense TFLOP/s "
            "scaled by SMs and clock. FlowKV's heterogeneous servers (sec. 4.1). Ada like the "
            "L40S: priced by the L40S's kernel tables scaled per bound; memory the L40S's "
            "46,068 MiB (the same 48 GB of GDDR6 with ECC)", int8_tops=239,
            kernel_tables="l40s"),
    GpuSpec("rtx-4090d", tflops=147.1, hbm_gb_s=1008, memory_bytes=24564 * MIB, link_gb_s=32,
            interconnect="pcie",
            source="Ada whitepaper: RTX 4090 165.2 dense FP16 tensor TFLOP/s with FP32 "
            "accumulate on 128 SMs; the 4090D has 114 SMs at the same boost clock "
            "(165.2*114/128); 24 GB GDDR6X at 1,008 GB/s; no NVLink, PCIe 4.0 x16 "
            "32 GB/s each way; dense INT8 660.6 TOP/s on the 4090, 588.3 scaled the same way; "
            "memory 24,564 MiB, what nvidia-smi reports for the 24 GB RTX 4090 and 4090D",
            int8_tops=588.3, kernel_tables="l40s"),
    # measured by AIConfigurator 0.12.0 (its systems/<name>.yaml datasheet figures)
    GpuSpec("h200", tflops=989, hbm_gb_s=4800, memory_bytes=141 * GIB, link_gb_s=450,
            source="NVIDIA H200 SXM datasheet: 989 dense BF16 TFLOP/s, 141 GB HBM3e at "
            "4.8 TB/s (141 GiB, AIConfigurator's mem_capacity), NVLink 900 GB/s two-way; "
            "kernel tables measured (h200_sxm)",
            int8_tops=1978, kernel_tables="h200"),
    GpuSpec("b200", tflops=2250, hbm_gb_s=7700, memory_bytes=180 * GIB, link_gb_s=900,
            source="NVIDIA B200 (HGX) datasheet: 2,250 dense BF16 TFLOP/s, 180 GB HBM3e at "
            "7.7 TB/s (180 GiB, AIConfigurator's mem_capacity), NVLink 5 1.8 TB/s two-way; "
            "kernel tables measured (b200_sxm)",
            int8_tops=4500, kernel_tables="b200"),
    GpuSpec("b300", tflops=2250, hbm_gb_s=7750, memory_bytes=275040 * MIB, link_gb_s=900,
            source="NVIDIA B300 (HGX) as AIConfigurator lists it: 2,250 dense BF16 TFLOP/s, "
            "288 GB HBM3e at 7.75 TB/s (275,040 MiB as nvidia-smi reports), NVLink 5; kernel "
            "tables measured (b300_sxm)",
            int8_tops=4500, kernel_tables="b300"),
    GpuSpec("gb200", tflops=2500, hbm_gb_s=8000, memory_bytes=189471 * MIB, link_gb_s=900,
            source="NVIDIA GB200 NVL72, per GPU: 2,500 dense BF16 TFLOP/s, 186 GB HBM3e at "
            "8 TB/s (189,471 MiB as nvidia-smi reports), NVLink 5; kernel tables measured "
            "(gb200)", int8_tops=5000,
            kernel_tables="gb200"),
    GpuSpec("gb300", tflops=2500, hbm_gb_s=8000, memory_bytes=284208 * MIB, link_gb_s=900,
            source="NVIDIA GB300 NVL72, per GPU: 2,500 dense BF16 TFLOP/s, 279 GB HBM3e at "
            "8 TB/s (284,208 MiB as nvidia-smi reports), NVLink 5; kernel tables measured "
            "(gb300)", int8_tops=5000,
            kernel_tables="gb300"),
    GpuSpec("l40s", tflops=362.05, hbm_gb_s=864, memory_bytes=46068 * MIB, link_gb_s=32,
            interconnect="pcie",
            source="NVIDIA L40S datasheet: 362 dense BF16 TFLOP/s, 48 GB GDDR6 (46,068 MiB as "
            "nvidia-smi reports) at 864 GB/s, no NVLink, PCIe 4.0 x16; kernel tables "
            "measured (l40s)", int8_tops=733, kernel_tables="l40s"),
    GpuSpec("rtx-pro-6000", tflops=467.8, hbm_gb_s=1792, memory_bytes=97887 * MIB, link_gb_s=64,
            interconnect="pcie",
            source="NVIDIA RTX PRO 6000 Blackwell Server Edition: 467.8 dense BF16 TFLOP/s "
            "at 2,430 MHz, 96 GB GDDR7 (97,887 MiB as nvidia-smi reports) at 1.79 TB/s, PCIe "
            "5.0 x16; kernel tables measured "
            "(rtx_pro_6000_server)", int8_tops=935.6, kernel_tables="rtx-pro-6000"),
]}


def check_tp(model: ModelSpec, tp: int) -> None:
    if tp < 1:
        raise ValueError(f"tp must be at least 1, got {tp}")
    if model.heads % tp or model.kv_heads % tp:
        raise ValueError(f"tp={tp} does not divide {model.name}'s "
                         f"{model.heads} heads / {model.kv_heads} KV heads")


def check_dense(model: ModelSpec, source: str) -> None:
    """`source` (a model without MoE operators) cannot price a mixture of experts."""
    if model.experts:
        raise ValueError(f"{model.name} is a mixture of experts: {source} has no MoE layer; "
                         f"it is priced by the measured engines' MoE tables (--backend vllm, "
                         f"sglang or trtllm)")


def model_spec(name: str) -> ModelSpec:
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None


def gpu_spec(name: str) -> GpuSpec:
    try:
        return GPUS[name.lower()]
    except KeyError:
        raise ValueError(f"unknown gpu {name!r}; known: {', '.join(sorted(GPUS))}") from None

"""The live engine of one instance: a Llama/Qwen2 decoder in PyTorch over a paged KV pool
(FlowKV layout), checkpoint loading (GGUF, Hugging Face), tokenizer and chat template,
sampling (where the logits are), KV export and import between instances, session history
KV, the start-up profile; on a GPU, CUDA graphs and batched prefill, and as options attention
in place over the pool (FlexAttention) and fused elementwise kernels."""

"""The live engine of one instance: a Llama/Qwen2 decoder in PyTorch over a paged KV pool
(FlowKV layout), checkpoint loading (GGUF, Hugging Face), tokenizer and chat template,
sampling, KV export and import between instances, session history KV, the start-up
profile; on a GPU, CUDA graphs and batched prefill."""

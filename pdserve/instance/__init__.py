"""The instance-side scheduler shared by both worlds: `LocalScheduler` forms each batch
(continuous batching, chunked prefill, decode or prefill first, preemption) over a KV
block budget it owns, with the prefix cache, session history, queue orders, the decode
load forecast and the load every instance shows policies (`stats.InstanceLoad`)."""

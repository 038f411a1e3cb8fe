"""pdserve: LLM serving with prefill/decode disaggregation whose split adapts at run time, and
a trace-replay simulator that runs the same policies, to choose one before deploying it.

One pure global scheduler (`cluster/`) drives a simulated cluster (`sim/`) and a live one
(`live/` with worker processes, `worker/`, and the HTTP server, `server/`). Start at
`docs/ARCHITECTURE.md`."""

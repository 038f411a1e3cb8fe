"""ARES: decode-to-decode rescheduling on predicted load (one file per phase of Alg. 1); the
`vllm`, `reschedule-current` and `ares` presets in `preset.py`; predicted-length-aware
dispatch from prefill to decode, the `predicted-load` decode router, in `dispatch.py`."""

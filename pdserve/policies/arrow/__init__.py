"""Arrow: elastic prefill/decode pools with SLO-aware dispatch (one file per algorithm):
the TTFT predictor and Max Running Tokens (`profiling.py`), Alg. 1 and 2 (the routers),
the pools and zero-wait flips of Alg. 3-4 (`pools.py`, `role_manager.py`); the shared
context in `preset.py`."""

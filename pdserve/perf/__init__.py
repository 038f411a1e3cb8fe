"""Performance models: how long a batch, a decode span and a KV transfer take on a model x
GPU x tensor-parallel setup (the runtime form in `fitted.py`), fitted from operator
timings (Vidur's A100 profiles, calibrated curves and corrections), from the live
engine's profile, or from a live run's step log."""

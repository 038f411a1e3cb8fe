"""TaiChi: P-heavy and D-heavy instances by chunk size (the sliders, `settings.py`),
length-aware prefill (Alg. 2) and flowing decode (Alg. 1); the composition in
`preset.py`."""

"""Scheduling policies as compositions of small components (prefill router, decode router,
role manager, rebalancer, queue order, instance chunk sizes; `base.py`). One folder per
paper, one file per algorithm, each paper's composition in its `preset.py`; the named
presets in `presets.py`."""

"""FlowKV: load-aware scheduling (Alg. 1) over status vectors and weighted scores, its
normal / imbalanced / extreme scenarios, elastic scaling from a reserve and prefix-hit
routing (one file per part); the composition in `preset.py`, the tunables in
`settings.py`."""

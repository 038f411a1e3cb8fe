"""AMPD: multi-round inference over disaggregated serving (one file per algorithm).

`context.py` windowed TTFT/ITL statistics and the decision log; `binding.py` session
binding (sec. 3); `cost_model.py` Eq. 1-2; `routing.py` Alg. 1 and the bound decode;
`reordering.py` Alg. 2; the planner of Eq. 5 is `pdserve/planning/ampd.py`.
"""

"""`pdserve plan --policy NAME`: offline searches for a policy and its deployment. `all` (the
default): every preset and composition, screened analytically, simulated short, confirmed
over seeds (`planner.py`); the papers' own planners stay beside it (TaiChi's sliders, AMPD's
ILP). `verdict.py` compares policies each tuned by that search, with intervals over seeds."""

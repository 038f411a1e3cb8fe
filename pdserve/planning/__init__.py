"""`pdserve plan --policy NAME`: offline searches for a policy's configuration or deployment
(one module per paper's planner: TaiChi's sliders, AMPD's ILP)."""

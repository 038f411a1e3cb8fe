"""Deployment planners: `pdserve plan --policy NAME` (one module per paper's planner)."""

"""`pdserve plan`: offline searches for a policy's configuration (one module per planner)."""

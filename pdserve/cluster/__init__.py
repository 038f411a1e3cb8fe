"""The cluster's brain, shared by both worlds: the pure global scheduler (events and a view in,
actions out), the role board, the driver contract (`actions.World`, `apply_actions`) and
the decisions both worlds share (where a session round's history comes from), the record
of what happened (`history.py`: the decision log with reasons, instances' load over time),
and the cluster's topology and links."""

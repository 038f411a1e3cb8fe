"""The cluster's brain, shared by both worlds: the pure global scheduler (events and a view in,
actions out), the role board, the driver contract (`actions.World`, `apply_actions`) and
the decisions both worlds share (where a session round's history comes from), and the
cluster's topology and links."""

"""The simulated world: a discrete-event driver with a virtual clock that runs the global
scheduler over simulated instances (the shared local scheduler, timed by a performance
model), KV transfers on contended links, elastic scaling, sessions and heterogeneous
clusters; `runner.Experiment` turns a config into runs and goodput searches."""

"""The live world's driver: `LiveDriver` runs the global scheduler on the wall clock over
worker processes (or Ray actors) and carries out its actions (`cluster.actions.World`);
failover, elastic worker lifecycle, token streaming to clients, sessions, status and
metrics; the replay client (`pdserve bench`)."""

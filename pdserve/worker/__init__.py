"""A live instance: the worker process that runs the shared local scheduler and the engine,
its message protocol with the driver (`messages.py`), its KV moves, load reports,
session history and decode-load forecast."""

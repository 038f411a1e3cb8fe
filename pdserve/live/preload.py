"""Imported once by the workers' fork server (`processes.worker_context`): torch and the
worker code, then `gc.freeze()`, so the objects created by those imports move to the
permanent generation and the garbage collector of each forked worker never touches (and so
never copies) their pages."""

import gc

import torch  # noqa: F401

import pdserve.worker.worker  # noqa: F401

gc.freeze()

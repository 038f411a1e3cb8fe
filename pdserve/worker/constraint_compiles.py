"""Structured-output constraints compiled beside the batch loop, not inside it.

A worker compiles each new constraint once (`GrammarCompiler`, cached) when a request that
carries it is added or adopted. Compiling a large one takes seconds (a `guided_choice` of
60,000 strings: ~8 s on a CPU worker), and inside the batch loop that froze every other
stream on the worker for as long: one client could stall them all by sending a fresh large
constraint every few seconds. The grammar engine (llguidance) releases the GIL while it
compiles, so a thread does it while the loop keeps stepping.

`ConstraintCompiles.holds(command)` parks a command whose constraint is not compiled yet,
and any later command for a parked request, so a request's commands stay in their order;
one compile runs per constraint, whichever requests wait on it. `released()` hands back the
parked commands whose compile finished, in arrival order, with the compile's error if it
failed (the worker fails that request alone, as it fails an invalid one at `add`). A
cancelled request's parked commands are forgotten (`forget`): it holds no KV and no engine
state yet.
"""

from __future__ import annotations

from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from pdserve.engine.engine import Engine
from pdserve.engine.sampling_params import OutputConstraint
from pdserve.worker.messages import AddRequest, AdoptKV, Command


def constraint_of(command: Command) -> OutputConstraint | None:
    """The structured-output constraint a command brings to this worker, if any."""
    if isinstance(command, AddRequest):
        return command.params.constraint
    if isinstance(command, AdoptKV):
        return command.handoff.params.constraint
    return None


def request_of(command: Command) -> int | None:
    if isinstance(command, AdoptKV):
        return command.handoff.request_id
    return getattr(command, "request_id", None)


class ConstraintCompiles:
    """The compiles in flight (one thread) and the commands parked on them, by request."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._executor: ThreadPoolExecutor | None = None  # started by the first compile
        self._compiling: dict[OutputConstraint, Future[None]] = {}
        # request id -> (the constraint it waits for, its commands in arrival order)
        self._parked: OrderedDict[int, tuple[OutputConstraint, list[Command]]] = OrderedDict()

    @property
    def waiting(self) -> bool:
        """Some command waits for a compile (the idle loop should look again soon)."""
        return bool(self._parked)

    def holds(self, command: Command) -> bool:
        """Park `command` if it must wait for a compile; True if it was parked."""
        request_id = request_of(command)
        if request_id is not None and request_id in self._parked:
            self._parked[request_id][1].append(command)
            return True
        constraint = constraint_of(command)
        if constraint is None or request_id is None:
            return False
        try:
            grammars = self._engine.grammars()
        except ValueError:
            return False  # no tokenizer: `add` fails the request with the reason
        if grammars.is_compiled(constraint):
            return False
        if constraint not in self._compiling:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="constraints")
            self._compiling[constraint] = self._executor.submit(grammars.compile, constraint)
        self._parked[request_id] = (constraint, [command])
        return True

    def forget(self, request_id: int) -> list[Command]:
        """A cancelled request's parked commands, no longer parked (its compile goes on: the
        next request with that constraint finds it compiled)."""
        parked = self._parked.pop(request_id, None)
        return [] if parked is None else parked[1]

    def released(self) -> list[tuple[list[Command], Exception | None]]:
        """The parked commands whose constraint's compile has finished, by request in
        arrival order, each with the compile's error (None: compiled)."""
        done = {c: f for c, f in self._compiling.items() if f.done()}
        if not done:
            return []
        for constraint in done:
            del self._compiling[constraint]
        out: list[tuple[list[Command], Exception | None]] = []
        for request_id, (constraint, commands) in list(self._parked.items()):
            future = done.get(constraint)
            if future is not None:
                del self._parked[request_id]
                error = future.exception()
                out.append((commands, error if isinstance(error, Exception) else None))
        return out

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

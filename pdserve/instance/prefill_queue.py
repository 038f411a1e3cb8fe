"""An instance's prefill work: waiting requests and admitted, partially computed ones.

Waiting requests are kept in the order the `QueueOrder` hook gives (preempted requests go
back to the front, as in vLLM); admitted ones are computed chunk by chunk in admission order.
The queue keeps the load figures policies read, incrementally, so reading them is O(1):
remaining tokens and remaining attention work (sum of n*(n + 2p) over what is left).
"""

from __future__ import annotations

from pdserve.instance.queue_order import QueueOrder
from pdserve.types import Request, attn_units


def _remaining_units(request: Request) -> int:
    return attn_units(request.prefill_target_tokens - request.prefilled_tokens,
                      request.prefilled_tokens)


class PrefillQueue:
    def __init__(self, order: QueueOrder) -> None:
        self.order = order
        self.waiting: list[Request] = []
        self.active: dict[int, Request] = {}  # admitted, holding KV blocks
        self.tokens = 0
        self.attn_units = 0
        self._choice: list[int] | None = None

    def __len__(self) -> int:
        return len(self.waiting) + len(self.active)

    def push(self, request: Request) -> None:
        """Queue a request to (re)compute all its tokens; behind the others, per the order."""
        self._reset(request)
        self.order.insert(self.waiting, request)

    def push_front(self, request: Request) -> None:
        """Queue a preempted request ahead of every waiting one; it lost its KV, history
        included, so it recomputes everything."""
        request.cached_prefix_tokens = 0
        self._reset(request)
        self.waiting.insert(0, request)

    def _reset(self, request: Request) -> None:
        """A session round starts after the history KV it reuses (`cached_prefix_tokens`):
        only the new tokens are computed, attending to the history."""
        target = request.input_tokens + request.generated_tokens
        reused = min(request.cached_prefix_tokens, target - 1)
        request.prefill_target_tokens = target
        request.prefilled_tokens = reused
        self.tokens += target - reused
        self.attn_units += attn_units(target - reused, reused)

    def peek(self) -> Request:
        """The waiting request to admit next, as the order chooses (`choose`, optional:
        AMPD's reordering looks at a window at the head)."""
        choose = getattr(self.order, "choose", None)
        self._choice = choose(self.waiting) if choose is not None else None
        return self.waiting[self._choice[0]] if self._choice else self.waiting[0]

    def admit_head(self) -> Request:
        """Admit the request `peek` returned (the head if `peek` was not asked)."""
        choice, self._choice = self._choice, None
        if choice is not None:
            self.order.commit(self.waiting, choice)  # type: ignore[attr-defined]
        request = self.waiting.pop(0)
        self.active[request.request_id] = request
        return request

    def advance(self, request: Request, tokens: int) -> bool:
        """Count a computed chunk; True when the request's prefill is complete."""
        done, target = request.prefilled_tokens, request.prefill_target_tokens
        request.prefilled_tokens = done + tokens
        self.tokens -= tokens
        # the remaining units (`_remaining_units`) drop by the chunk's own: chunks add up
        self.attn_units -= attn_units(tokens, done)
        if done + tokens < target:
            return False
        del self.active[request.request_id]
        return True

    def skip(self, request: Request, tokens: int) -> None:
        """Count `tokens` as computed without computing them (a prefix-cache hit)."""
        before = _remaining_units(request)
        request.prefilled_tokens += tokens
        self.tokens -= tokens
        self.attn_units -= before - _remaining_units(request)

    def drop(self, request: Request) -> None:
        """Remove a request, admitted (preempted, cancelled) or waiting, with its load."""
        if request.request_id in self.active:
            del self.active[request.request_id]
        else:
            self.waiting.remove(request)
        self.tokens -= request.prefill_target_tokens - request.prefilled_tokens
        self.attn_units -= _remaining_units(request)

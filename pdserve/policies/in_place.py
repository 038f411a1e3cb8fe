"""In-place decode: a request decodes on the instance that prefilled it (no KV transfer).

The decode router of colocated (aggregated) serving, and of any policy that keeps decodes
where their KV already is.
"""

from __future__ import annotations

from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.types import Request


class InPlaceDecodeRouter:
    def route(self, request: Request, prefill_instance: int, view: ClusterView,
              board: RoleBoard) -> int:
        return prefill_instance

"""Heterogeneous clusters: instances grouped by GPU type and role (FlowKV sec. 4.3).

`--instances 4xl20:prefill,4xh20:decode` is four L20 prefill instances and four H20 decode
instances; a group may name a tensor-parallel degree (`2xh20/tp2:decode`). Roles: prefill,
decode, mixed (colocated), reserve (held back for FlowKV's elastic scaling). Instance ids
follow role order (prefill, decode, mixed, reserve), the order fixed xPyD roles assume; each
GPU type sits on servers of its own (`pdserve.sim.hetero`).
Each instance gets its own performance model (compute, KV capacity, its GPU's link inside
its node).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pdserve.types import Role

GROUP_ROLES = {"prefill": Role.PREFILL, "decode": Role.DECODE, "mixed": Role.MIXED,
               "reserve": Role.RESERVE}
_ROLE_ORDER = [Role.PREFILL, Role.DECODE, Role.MIXED, Role.RESERVE]
_GROUP = re.compile(r"^(\d+)x([a-z0-9.-]+?)(?:/tp(\d+))?:([a-z]+)$")


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    count: int
    gpu: str
    role: Role
    tp: int = 0  # 0: the setup's default for the model on this GPU


def parse_instances(spec: str) -> list[InstanceGroup]:
    """Groups of `COUNTxGPU[/tpN]:ROLE`, comma-separated, sorted into role order."""
    groups = []
    for part in spec.replace(" ", "").lower().split(","):
        match = _GROUP.match(part)
        if not match:
            raise ValueError(f"instances: cannot read {part!r}; expected COUNTxGPU[/tpN]:ROLE "
                             f"like 4xl20:prefill (roles: {', '.join(GROUP_ROLES)})")
        count, gpu, tp, role = match.groups()
        if role not in GROUP_ROLES:
            raise ValueError(f"instances: unknown role {role!r} in {part!r}; known: "
                             f"{', '.join(GROUP_ROLES)}")
        if int(count) < 1:
            raise ValueError(f"instances: a group needs at least one instance, got {part!r}")
        groups.append(InstanceGroup(int(count), gpu, GROUP_ROLES[role], int(tp or 0)))
    return sorted(groups, key=lambda g: _ROLE_ORDER.index(g.role))


def format_instances(groups: list[InstanceGroup]) -> str:
    """The `COUNTxGPU[/tpN]:ROLE` spec of `groups`, in their order (`parse_instances` reads
    it back)."""
    names = {role: name for name, role in GROUP_ROLES.items()}
    return ",".join(f"{g.count}x{g.gpu}" + (f"/tp{g.tp}" if g.tp else "") + f":{names[g.role]}"
                    for g in groups)


def instances_arg(value: str) -> int | str:
    """The `--instances` flag: a count (colocated presets) or a group spec."""
    if value.strip().isdigit():
        return int(value)
    parse_instances(value)  # fail early, naming the group
    return value

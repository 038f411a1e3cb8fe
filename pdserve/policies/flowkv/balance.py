"""Imbalanced load (FlowKV Alg. 1 lines 24-27, appendix B.1): idle instances of the side
that is not overloaded help the overloaded phase for a number of scheduling cycles.

An idle instance (its own phase's score C_i under `idle_instance`) becomes MIXED, so
dispatch may send it the overloaded phase's work, and its local scheduler serves that phase
first (`SetPhasePriority`): a prefill instance helping decode turns decode-first, a decode
instance helping prefill turns prefill-first. It serves terms of `switch_ticks` ticks; at
the end of a term it returns to its home role and the policy's default priority (the
global controller's "terminate_signal", line 27) unless the load is still imbalanced toward
the phase it helps, and it returns at once if its own side becomes overloaded. Work it took
meanwhile finishes there: roles steer dispatch only.

pdserve also lends idle instances under extreme load (Alg. 1 only scales there): while the
reserve is empty or a new instance is still starting, an idle instance of the side that is
not overloaded is the only help there is; the scaler acts as well.
"""

from __future__ import annotations

from pdserve.cluster.actions import Action, SetPhasePriority
from pdserve.cluster.events import ClusterView
from pdserve.cluster.roles import RoleBoard
from pdserve.instance.phase_priority import PhasePriority
from pdserve.policies.flowkv.context import FlowKVContext
from pdserve.policies.flowkv.scenario import Scenario
from pdserve.types import Role


class PhaseBalancer:
    def __init__(self, context: FlowKVContext, default_priority: PhasePriority) -> None:
        self.context = context
        self.default_priority = default_priority
        self.switched: dict[int, int] = {}  # instance -> ticks left

    def on_tick(self, scenario: Scenario, view: ClusterView, board: RoleBoard) -> list[Action]:
        context = self.context
        actions: list[Action] = []
        to_prefill = context.classifier.overloaded_phase_is_prefill(context.c_prefill,
                                                                    context.c_decode)
        for i, left in list(self.switched.items()):
            ending = self._ending(i, left - 1, scenario, to_prefill, board)
            if not ending:
                self.switched[i] = left - 1 if left > 1 else context.settings.switch_ticks
                continue
            del self.switched[i]
            reason = f"flowkv alg1: end of imbalance help, {ending}"
            if context.homes[i] in (Role.PREFILL, Role.DECODE):
                board.set_role(i, context.homes[i], reason)
            actions.append(SetPhasePriority(i, self.default_priority, reason))
        if scenario is Scenario.NORMAL:
            return actions
        helpers_home = Role.DECODE if to_prefill else Role.PREFILL
        own_scores = context.decode_scores if to_prefill else context.prefill_scores
        priority = PhasePriority.PREFILL_FIRST if to_prefill else PhasePriority.DECODE_FIRST
        overloaded, c_over = ("prefill", context.c_prefill) if to_prefill else \
            ("decode", context.c_decode)
        for i in context.side(helpers_home, board):
            if (i in self.switched or board.roles[i] is not helpers_home
                    or own_scores[i] >= context.settings.idle_instance):
                continue  # already helping, starting up, or busy with its own phase
            reason = (f"flowkv alg1: {scenario.value} load, {overloaded} overloaded "
                      f"(C={c_over:.2f}); idle {helpers_home.value} instance "
                      f"(C_i={own_scores[i]:.2f}) serves {overloaded} first for "
                      f"{context.settings.switch_ticks} cycles")
            board.set_role(i, Role.MIXED, reason)
            actions.append(SetPhasePriority(i, priority, reason))
            self.switched[i] = context.settings.switch_ticks
        return actions

    def _ending(self, instance_id: int, left: int, scenario: Scenario, to_prefill: bool,
                board: RoleBoard) -> str:
        """Why a lent instance goes home now ("" : it stays). At any time: it failed, or its
        home side needs it (that side's level rose). At the end of its term: the scenario
        is no longer imbalanced toward the phase it helps; otherwise it serves another term
        (Alg. 1 line 27: it cycles until the controller ends it)."""
        context = self.context
        home = context.homes[instance_id]
        helping_prefill = home is Role.DECODE
        if instance_id in board.failed or home not in (Role.PREFILL, Role.DECODE):
            return "it left its side"
        classifier = context.classifier
        home_level = classifier.decode_level if helping_prefill else classifier.prefill_level
        if home_level == 2:  # level 1 is tolerated: the lent work itself loads its scores
            return f"its own {home.value} side is overloaded"
        if left > 0:
            return ""
        if scenario is Scenario.NORMAL:
            return f"its {context.settings.switch_ticks} cycles are over and the scenario " \
                "is normal"
        if to_prefill is not helping_prefill:
            return f"its {context.settings.switch_ticks} cycles are over and the other " \
                "phase is the overloaded one now"
        return ""

"""`SpendAlert`: an environment's monthly budget (Modal's hard cap) plus our alert thresholds.

Modal side: `EnvironmentSetBudget` sets the environment's cycle budget in dollars; when usage
reaches it Modal stops the environment's work (a hard cap). `EnvironmentGetBudget` reports
usage, the effective limit and whether the limit is reached. Create first reads the budget
the environment already had and records it (`previous_budget_usd`, None = no budget); delete
puts that value back (or clears the budget when there was none), so destroying a SpendAlert
never removes a budget someone else set. One SpendAlert per environment.

Our side (Modal has no thresholds or webhooks): `thresholds` (fractions of the budget) are kept
here and reported: create, update and read (refresh) compute `thresholds_crossed` = the
thresholds t with usage >= t * budget (with a budget of 0: every threshold once usage > 0), for
information only. Nothing here posts alerts: delivery is the spend watcher's job, a scheduled
Modal function the stack deploys into the environment (watchers/spend_alerts.py, wired by
`ServingEnvironment`), which reads the same budget RPC and posts each newly crossed threshold
once. So Diff depends on the inputs only, and an `up` with unchanged inputs changes nothing,
whatever the usage or the webhook's state. State written by earlier versions (`webhook_url`,
`thresholds_alerted`) is dropped by the next update and ignored until then.

A create whose answer was lost (issue 32 item 10: the run died after Modal set the budget)
would have the next create read back its own budget as "previous", and destroy would then
leave it in place. So with an `owner` mark, create first writes a *pending record* in the
environment (`_rpc.pending_begin`: a secret named after the mark, whose key names hold the
budget found, `MODAL_LLM_PREVIOUS_USD_CENTS_<n>` or `..._NONE`) and drops it once the budget
is set; the next create of this resource that finds the record takes the previous budget
from it, not from Modal. Setting a budget is repeatable as is (one SpendAlert per
environment), so nothing else needs telling apart.

Id: the environment id (`en-...`); import with that id (the environment name is taken from
Modal, so importing under the wrong environment name shows as a replace and fails). Read
reports a cleared budget or a deleted environment as gone.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, ReadResult, UpdateResult

from . import _rpc
from ._base import (
    ModalProvider,
    environment_name,
    environment_problems,
    owner_of,
    plain_view,
)
from ._schema import Schema, SchemaResource, output, owner, replaces, updates
from .app import AppArgs, AppProvider

DEFAULT_THRESHOLDS = (0.5, 0.8, 1.0)


#: The one threshold rule (issue 14.6): a fraction of the budget in (0, MAX_THRESHOLD].
#: Stack config (`alertThresholdsPct`, whole percentages) applies this same rule.
MAX_THRESHOLD = 1.5


def threshold_problem(t: Any) -> str | None:
    """Why `t` is not a valid alert threshold (a fraction of the budget), or None."""
    if (
        isinstance(t, bool)
        or not isinstance(t, int | float)
        or not math.isfinite(t)
        or not 0 < t <= MAX_THRESHOLD
    ):
        return (
            f"threshold {t!r} is outside (0, {MAX_THRESHOLD:g}]: thresholds are fractions of"
            " the budget, e.g. 0.5, 0.8, 1.0"
        )
    return None


def _thresholds(props: Mapping[str, Any]) -> list[float]:
    raw = props.get("thresholds")
    return sorted(float(t) for t in (raw if raw is not None else DEFAULT_THRESHOLDS))


def _budget_problems(budget: Any) -> list[str]:
    if isinstance(budget, bool) or not isinstance(budget, int | float):
        return ["monthly_budget_usd must be a number of dollars"]
    if not math.isfinite(budget):
        return [f"monthly_budget_usd {budget} is not a finite number of dollars"]
    if budget < 0:
        return [
            f"monthly_budget_usd {budget} is negative: a budget is >= 0 dollars (0 blocks all"
            " spend)"
        ]
    return []


def _thresholds_problems(thresholds: Any) -> list[str]:
    if not isinstance(thresholds, list) or not thresholds:
        return ["thresholds must be a non-empty list of fractions"]
    problems = [p for p in map(threshold_problem, thresholds) if p]
    if len({float(t) for t in thresholds if isinstance(t, int | float)}) != len(thresholds):
        problems.append("thresholds must not repeat")
    return problems


class SpendAlertArgs(Schema):
    """Inputs of a `SpendAlert` (keywords), then what it outputs."""

    environment: pulumi.Input[str] = replaces(check=environment_problems)
    monthly_budget_usd: pulumi.Input[float] = updates(
        view=plain_view("monthly_budget_usd"), check=_budget_problems
    )
    #: Fractions of the budget (reported, not enforced: the spend watcher posts them).
    thresholds: pulumi.Input[Sequence[pulumi.Input[float]]] = updates(
        default_factory=lambda: list(DEFAULT_THRESHOLDS),
        view=_thresholds,
        check=_thresholds_problems,
    )
    owner: str = owner()
    environment_id: str = output()
    current_usage_usd: float = output()
    effective_limit_usd: float = output()
    limit_reached: bool = output()
    thresholds_crossed: list[float] = output()
    #: The budget the environment had before (None: none); delete puts it back.
    previous_budget_usd: float | None = output()


class SpendAlertProvider(ModalProvider):
    SCHEMA = SpendAlertArgs.SCHEMA

    @staticmethod
    def _target(props: Mapping[str, Any]) -> str:
        return f"budget of environment '{environment_name(props) or '<default>'}'"

    def _apply(
        self,
        props: Mapping[str, Any],
        env_id: str | None,
        action: str,
        previous: list[float | None] | None = None,
    ) -> tuple[str, Any]:
        """Set the budget (looking the env id up if needed) and read it back; with
        `previous`, first record the budget the environment had (None = none)."""
        env = environment_name(props)
        budget = float(props["monthly_budget_usd"])
        owner = owner_of(props) if previous is not None else ""

        async def go(client: Any) -> tuple[str, Any]:
            eid = env_id or await _rpc.environment_id(client, env)
            if previous is not None and not previous:
                record = await _rpc.pending_get(client, owner, env)
                if record is not None and record.kind == PENDING_KIND:
                    # An earlier create of this resource set the budget and its answer was
                    # lost: what was there before is what that create recorded.
                    previous.append(_previous_from(record.notes))
                else:
                    before = await _rpc.environment_get_budget(client, eid)
                    previous.append(
                        float(before.cycle_budget_dollars)
                        if before.HasField("cycle_budget_dollars")
                        else None
                    )
                    if owner:
                        note = (_previous_note(previous[0]),)
                        await _rpc.pending_begin(client, owner, env, PENDING_KIND, env, note)
            await _rpc.environment_set_budget(client, eid, budget)
            status = await _rpc.environment_get_budget(client, eid)
            await _rpc.pending_end(client, owner, env)
            return eid, status

        return self.run(action, self._target(props), go)

    @classmethod
    def _outputs(
        cls, props: Mapping[str, Any], status: Any, env_id: str, previous: float | None
    ) -> dict[str, Any]:
        """The outputs of the budget `status` Modal answered and the budget the environment
        had before (`previous`)."""
        budget = float(status.cycle_budget_dollars)
        usage = float(status.current_cycle_usage)
        thresholds = _thresholds(props)
        return cls.SCHEMA.outputs(
            props,
            monthly_budget_usd=budget,
            thresholds=thresholds,
            current_usage_usd=usage,
            effective_limit_usd=float(status.effective_cycle_spend_limit),
            limit_reached=bool(status.spend_limit_reached),
            thresholds_crossed=[
                t for t in thresholds if usage >= t * budget and (budget > 0 or usage > 0)
            ],
            environment_id=env_id,
            previous_budget_usd=previous,
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        previous: list[float | None] = []
        env_id, status = self._apply(props, None, "set", previous)
        before = previous[0] if previous else None
        return CreateResult(env_id, self._outputs(props, status, env_id, before))

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        _, status = self._apply(news, id_, "update")
        before = SpendAlertArgs.from_props(olds).previous_budget_usd
        return UpdateResult(self._outputs(news, status, id_, before))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        from modal import exception as mexc

        async def go(client: Any) -> tuple[Any, str]:
            item = await _rpc.environment_find(client, "environment_id", id_)
            if item is None:
                return None, ""
            try:
                status = await _rpc.environment_get_budget(client, id_)
            except mexc.NotFoundError:
                return None, ""
            return status, item.name

        status, env = self.run("read", f"{self._target(props)} ({id_})", go)
        if status is None or not status.HasField("cycle_budget_dollars"):
            return ReadResult("", {})
        # The id decides the environment: a declared name that differs shows as a replace.
        live_props = {**props, "environment": env}
        before = SpendAlertArgs.from_props(props).previous_budget_usd
        outs = self._outputs(live_props, status, id_, before)
        return ReadResult(id_, outs, self.SCHEMA.read_inputs(outs, props))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        from modal import exception as mexc

        previous = props.get("previous_budget_usd")
        restore: float | None = None
        if isinstance(previous, int | float) and not isinstance(previous, bool):
            restore = float(previous)
            action = f"restore (to the previous ${restore:g})"
        else:
            action = "clear"

        owner, env = owner_of(props), environment_name(props)

        async def go(client: Any) -> None:
            with contextlib.suppress(mexc.NotFoundError):  # env gone: its budget went with it
                await _rpc.environment_set_budget(client, id_, restore)
            await _rpc.pending_end(client, owner, env)  # a record an interrupted create left

        self.run(action, f"{self._target(props)} ({id_})", go)


#: What a SpendAlert's pending record names (the environment whose budget it sets).
PENDING_KIND = "budget"
PREVIOUS_NOTE = "MODAL_LLM_PREVIOUS_USD_CENTS_"


def _previous_note(previous: float | None) -> str:
    """The budget found before a create, as a key name (whole cents; NONE: no budget)."""
    return PREVIOUS_NOTE + ("NONE" if previous is None else str(round(previous * 100)))


def _previous_from(notes: tuple[str, ...]) -> float | None:
    for note in notes:
        if note.startswith(PREVIOUS_NOTE):
            value = note[len(PREVIOUS_NOTE) :]
            return int(value) / 100 if value.isdigit() else None
    return None


class SpendAlert(SchemaResource[SpendAlertArgs], module="modal", name="SpendAlert"):
    """Monthly budget (hard cap) + alert thresholds for one environment. Outputs: every field
    of `SpendAlertArgs`."""

    PROVIDER = SpendAlertProvider


class SpendWatchProvider(AppProvider):
    """The spend watcher app (watchers/spend_alerts.py): an `App` in every respect (deploy by
    path, diff on spec/source, stop on delete), under its own type so it is never counted or
    mistaken for a serving app."""


class SpendWatch(SchemaResource[AppArgs], module="modal", name="SpendWatch"):
    """The deployed spend watcher (an App: same inputs and outputs)."""

    PROVIDER = SpendWatchProvider


__all__ = [
    "MAX_THRESHOLD",
    "SpendAlert",
    "SpendAlertArgs",
    "SpendAlertProvider",
    "SpendWatch",
    "SpendWatchProvider",
    "threshold_problem",
]

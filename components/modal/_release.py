"""The release transaction of an App: observe, decide, apply.

```
            read what Modal holds (history + release records)
                               │ (a read error here: nothing published, nothing changed)
                               ▼
   publish ──(answer lost)──► look again: published? ──no──► undo a create / "vN keeps serving"
      │ ok                              │ yes (or unknown → stop with the exact command)
      ▼                                 ▼
   verify (HealthGate: containers, crash loop, /ready, smoke by task, bounded deadline)
      │ passed                          │ anything else (timeout, crash loop, 5xx, Modal error,
      ▼                                 ▼  an exception, Ctrl-C)
   commit: record "passed",          abort: record "failed"; roll back to the last known-good
   outputs say what is live          version (an update) or stop the app (a create), re-check
                                     that it answers the smoke request, record that; raise the
                                     reason, the rollback line and the log tail
```

Three parts, one job each: `_effects.Effects` observes and acts (the only part that talks to
Modal), `_decide.decide` says what to do from what was observed (no I/O: table-tested),
and `execute` here runs them in order and words the result. After the publish no exception
escapes `execute` without the rollback having been tried (and said).
"""

from __future__ import annotations

import dataclasses
import sys
import time

from ._base import ModalProviderError
from ._decide import (
    FAILED,
    Commit,
    Decision,
    GateOutcome,
    Observed,
    Policy,
    Published,
    ReleaseResult,
    RollBack,
    Stop,
    Timeline,
    UndoCreate,
    decide,
    env_flag,
    recheck_record,
    rollback_command,
    skip_gate,
    smoke_words,
)
from ._effects import Effects
from ._gate import HealthGate
from .defaults import MIN_STEP_S


def execute(policy: Policy, fx: Effects, app_id_before: str) -> ReleaseResult:
    """Publish, verify, commit or roll back. Returns the release's outputs; raises a
    ModalProviderError saying what failed, what was undone and what to do next.
    `app_id_before`: the app serving under this name before ("" for a create of a new app)."""
    timeline = Timeline(time.monotonic(), ready_s=policy.ready_s, margin=policy.rollback_margin)
    try:
        before = fx.read(app_id_before) if app_id_before else None
    except ModalProviderError as e:
        raise type(e)(
            f"{e} Nothing was published (the release reads what is live first); what"
            " served before keeps serving."
        ) from None
    if before is not None:
        fx.records.update(before.records())
    observed = Observed(policy, before)
    timeline.started = time.monotonic()
    read_back_error = ""
    try:
        result = fx.publish(before.tags if before else {})
    except ModalProviderError as error:
        observed = _after_failed_publish(fx, observed, error)
    else:
        app_id, url = str(result["app_id"]), str(result.get("web_url") or "")
        try:
            published = fx.published(app_id, url or str(result.get("gate_url") or ""), before)
        except ModalProviderError as e:
            # Modal took the deploy but cannot say what is live: with no gate the release
            # stands (read_back_error says so); with one it is rolled back blind.
            gated = policy.gate_on
            version = 0 if gated else int(result.get("version") or 0)
            published = Published(app_id, version, 0.0, "" if gated else url, True, policy.tag, "")
            observed = dataclasses.replace(observed, published=published, read_error=str(e))
            why = (
                f"deployed as {app_id}, but what is live could not be read back: {e}"
                " `pulumi refresh` fills it in."
            )
            read_back_error = str(result.get("read_back_error") or "") or why
            if not policy.gate_on:
                fx.warn(why, warning=True)
        else:
            observed = dataclasses.replace(observed, published=published)
    if not observed.read_error:
        timeline.published = time.monotonic() - timeline.started
    return _verify_and_settle(fx, policy, observed, timeline, read_back_error)


def _after_failed_publish(fx: Effects, observed: Observed, error: ModalProviderError) -> Observed:
    """The deploy failed; it may still have published (its answer lost). Look: if it did,
    the release goes on to the gate like any other; if not, stop (raises)."""
    try:
        published = fx.found_after_lost_answer(observed.before)
    except ModalProviderError as e:
        look = dataclasses.replace(observed, publish_error=str(error), look_error=str(e))
        raise ModalProviderError(_stop_words(decide(look, None))) from None
    if published is not None:
        return dataclasses.replace(observed, published=published)
    decision = decide(dataclasses.replace(observed, publish_error=str(error)), None)
    if isinstance(decision, UndoCreate):
        raise type(error)(f"{error} {fx.undo_create()}") from None
    raise type(error)(_stop_words(decision)) from None


def _stop_words(decision: Decision) -> str:
    assert isinstance(decision, Stop), decision
    return decision.what


def _verify_and_settle(
    fx: Effects, policy: Policy, observed: Observed, timeline: Timeline, read_back_error: str
) -> ReleaseResult:
    """The one place after the publish: whatever happens (an exception, Ctrl-C), what the
    release made live is committed or undone before anything escapes."""
    published = observed.published
    assert published is not None
    try:
        outcome = skip_gate(observed) or _verify(fx, policy, published, timeline)
    except BaseException as e:  # an interrupt too: roll back, then stop
        outcome = GateOutcome(False, "error", f"{type(e).__name__}: {e}", 0.0)
        if not isinstance(e, Exception):
            error = _apply_failure(fx, observed, outcome, decide(observed, outcome), timeline)
            print(str(error), file=sys.stderr)
            raise
    decision = decide(observed, outcome)
    if isinstance(decision, Commit):
        return _commit(fx, observed, decision, outcome, read_back_error)
    raise _apply_failure(fx, observed, outcome, decision, timeline)


def _verify(fx: Effects, p: Policy, published: Published, timeline: Timeline) -> GateOutcome:
    gate = fx.gate(published.app_id, published.web_url)
    fx.say(
        f"published v{published.version} in {timeline.published:.1f} s; health gate:"
        f" GET /ready within {p.ready_s:g} s (start-up budget, timeouts.startup_s), then"
        f" {smoke_words(p.task)}, {p.gate_deadline:g} s in all; if refused, the rollback gets"
        f" at most {p.rollback_margin:g} s (rollback margin)"
    )
    outcome = gate.verify(
        f"v{published.version}",
        since=published.deployed_at,
        deadline_s=p.gate_deadline,
        must_leave=(0.0, published.deployed_at),
        ready_s=p.ready_s,
    )
    timeline.gate = outcome.seconds
    return outcome


def _commit(
    fx: Effects,
    observed: Observed,
    decision: Commit,
    outcome: GateOutcome,
    read_back_error: str,
) -> ReleaseResult:
    """Record the version's outcome and say what is live. An ungated release whose history
    could not be read back records nothing (`decision.record` ""): `read_back_error` says so."""
    p, published = observed.policy, observed.published
    assert published is not None
    if decision.record:
        warning = fx.record(published.app_id, {decision.version: decision.record})
        if warning:
            fx.warn(warning)
    return ReleaseResult(
        app_id=published.app_id,
        version=decision.version,
        previous_version=observed.pre,
        known_good_version=decision.known_good,
        deployment_tag=published.tag or p.tag,
        commit=published.commit,
        verdict=decision.verdict,
        gate_seconds=outcome.seconds,
        rollback_command=rollback_command(p.name, p.env, decision.rollback_to),
        web_url=published.web_url,
        read_back_error=read_back_error
        or (
            ""
            if published.web_url
            else "the endpoint URL could not be read back; `pulumi refresh` fills it in"
        ),
    )


def _apply_failure(
    fx: Effects,
    observed: Observed,
    outcome: GateOutcome,
    decision: Decision,
    timeline: Timeline,
) -> ModalProviderError:
    """Undo what the release made live, as decided; never raises. Returns the error to raise."""
    p, published = observed.policy, observed.published
    assert published is not None
    v = published.version
    what = f"v{v}" if v else "the new version"
    started = time.monotonic()
    timeline.stage = outcome.stage
    fx.say(
        f"{what} refused after {outcome.seconds:.1f} s ({outcome.stage}); undoing it within"
        f" the rollback margin of {p.rollback_margin:g} s"
    )
    gate: HealthGate | None = None
    tail: list[str] = []
    try:
        gate = fx.gate(published.app_id, published.web_url)
        tail = gate.log_tail(published.deployed_at) if published.deployed_at else []
    except Exception:  # a log tail is context, never decisive
        gate, tail = None, []
    head = (
        f"App {p.label}: {p.action} failed: {what} (tag {p.tag}) did not pass the"
        f" health gate: {outcome.reason or outcome.stage} (after {outcome.seconds:.1f} s)."
    )
    failed = 0 if isinstance(decision, Commit) else decision.failed
    if failed:
        note = fx.record(published.app_id, {failed: FAILED})
        head += f" {note}" if note else ""
    fix = "Fix the release (see the log below), then rerun `pulumi up`."
    if isinstance(decision, RollBack):
        done = _roll_back(fx, p, published, decision.to, gate, started)
        todo = (
            "Fix the release (see the log below), then rerun `pulumi up` (Pulumi's state"
            " keeps the inputs of the last release that passed)."
        )
        undo = f"rollback to v{decision.to}"
    elif isinstance(decision, UndoCreate):
        done, todo, undo = _stop_new(fx, published, decision.why), fix, "stop of the new app"
    else:
        assert isinstance(decision, Stop), decision
        done = decision.what
        todo = "Find out why it no longer serves (see the log below), then rerun `pulumi up`."
        undo = "nothing to undo"
    ended = time.monotonic()
    timeline.rollback = ended - started
    timeline.rollback_what = undo
    line = timeline.line(ended)
    fx.say(line)
    logs = "\n".join(f"  | {log}" for log in tail) or "  (no log lines)"
    message = f"{head}\n{done}\n{line}\n{todo}\nThe container's last log lines:\n{logs}"
    return ModalProviderError(fx.redact(message))


def _stop_new(fx: Effects, published: Published, why: str) -> str:
    """A create's app (or one with nothing to roll back to) is stopped: no failing
    version keeps taking traffic."""
    app_id, reason = published.app_id, f" ({why})" if why else ""
    error = fx.stop(app_id)
    if error:
        return (
            f"Stopping {app_id}{reason} FAILED ({error}): it may still take traffic. Finish it"
            f" with `{fx.stop_hint()}`."
        )
    return f"Stopped {app_id}{reason}: nothing of this release is left serving."


def _roll_back(
    fx: Effects,
    p: Policy,
    published: Published,
    target: int,
    gate: HealthGate | None,
    started: float,
) -> str:
    """AppRollback to `target`, record, then re-check it answers the smoke request once
    the failed version's containers are gone."""
    app_id = published.app_id
    error = fx.roll_back(app_id, target)
    if error:
        return (
            f"The rollback to v{target} (last known good) FAILED ({error}): the failed"
            f" version may still be serving. Finish it with"
            f" `{rollback_command(p.name, p.env, target)}`."
        )
    try:
        after = fx.read(app_id)
    except ModalProviderError as e:
        return (
            f"Rolled back to v{target} (last known good), but its new version could not be"
            f" read back ({e}); check `modal app history {p.name}{env_flag(p.env)}`."
        )
    live = after.live()
    assert live is not None
    records = {published.version: FAILED} if published.version else {}
    fx.record(app_id, records)  # a rollback may reset the app's tags: write them again
    if gate is None or not p.gate_on:
        return f"Rolled back to v{target} (last known good), live as v{live.version}."
    # What is left of the rollback margin (the RPC and the records took some of it).
    left = p.rollback_margin - (time.monotonic() - started)
    check = gate.verify(
        f"v{live.version} (v{target} again)",
        since=live.deployed_at,
        deadline_s=max(left, MIN_STEP_S),
        must_leave=(published.deployed_at or live.deployed_at, live.deployed_at),
    )
    fx.record(app_id, {live.version: recheck_record(check)})
    words = smoke_words(p.task)
    if check.ok:
        return (
            f"Rolled back to v{target} (last known good), live as v{live.version}, which"
            f" answered {words} again ({check.seconds:.1f} s) once the failed version's"
            " containers were gone."
        )
    if check.timed_out:
        return (
            f"Rolled back to v{target} (last known good), live as v{live.version}; it did"
            f" not answer {words} within the rollback margin ({p.rollback_margin:g} s):"
            f" {check.reason}. A cold start may take up to its start-up budget: check"
            f" `modal app logs {p.name}{env_flag(p.env)}` (recorded unverified)."
        )
    return (
        f"Rolled back to v{target} (last known good), live as v{live.version}, but it did"
        f" NOT answer {words}: {check.reason}. Check"
        f" `modal app logs {p.name}{env_flag(p.env)}`."
    )

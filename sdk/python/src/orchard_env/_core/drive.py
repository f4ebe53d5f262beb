"""Trainer-driven rollout groups: the driver's side (:class:`Episodes`), which Sandboxes an episode ran
for (:class:`DriveBook`) and the plans of ``RolloutGroup.drive`` (:class:`Driving`, a base of
:class:`~orchard_env._core.group.GroupCore`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from .. import _ops
from ..errors import (
    Conflict,
    NotFound,
    OrchardError,
    Timeout,
)
from ..models import DriveResult, EpisodeOutcome, GroupResult, TrajectoryResult
from .steps import NOW, Call, Plan, log

# -- trainer-driven rollout groups ----------------------------------------------------------------


class Episodes(Protocol):
    """The driver's side of :meth:`GroupCore._drive_plan`: runs episode plans concurrently (threads or
    tasks). Every method is a :class:`Call` hook (a coroutine function for the async driver)."""

    def start(self, sandbox: Any, record: Callable[[EpisodeOutcome], None]) -> Any:
        """Starts running ``GroupCore._episode_plan`` for ``sandbox`` in the background; the plan hands
        its :class:`EpisodeOutcome` to ``record`` when it ends (cancelled included)."""

    def running(self) -> Any:
        """How many started episodes have not ended."""

    def reap(self) -> Any:
        """Forgets the episodes that ended; answers the exceptions that escaped them (their result
        could not be posted)."""

    def settle(self) -> Any:
        """The group is complete: lets the episodes still running end (sync: waits for them; async:
        cancels them), then releases the workers."""

    def abandon(self) -> Any:
        """``drive`` is failing or cancelled: cancels what can be cancelled, without waiting."""


class DriveBook:
    """Which trajectory Sandboxes of group ``group`` an episode ran for, by UID (pure): an episode runs at
    most once per Sandbox UID, and never for one that failed, expired, is being deleted or already has a
    result before its episode started (the controller records those aborted)."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.started: set[str] = set()
        self.skipped: set[str] = set()

    def select(self, items: Sequence[Mapping[str, Any]], slots: int | None) -> list[Mapping[str, Any]]:
        """The listed Sandboxes to start an episode for now: Ready ones not seen before, in index order,
        at most ``slots`` (None: all); they are marked started."""
        chosen: list[Mapping[str, Any]] = []
        trajectories = []
        for item in items:
            meta = item.get("metadata") or {}
            index = _ops.trajectory_index(self.group, str(meta.get("name", "")))
            uid = meta.get("uid")
            if index is not None and uid and uid not in self.started and uid not in self.skipped:
                trajectories.append((index, str(uid), meta, item))
        for _, uid, meta, item in sorted(trajectories, key=lambda t: t[0]):
            status = item.get("status") or {}
            if meta.get("deletionTimestamp") or status.get("result") or status.get("phase") in _ops.FINAL_PHASES:
                self.skipped.add(uid)
            elif _ops.is_ready(item) and (slots is None or len(chosen) < slots):
                chosen.append(item)
                self.started.add(uid)
        return chosen

class Driving:
    """The plans of ``RolloutGroup.drive``: a base of :class:`~orchard_env._core.group.GroupCore`, whose
    state (``client``, ``name``, ``namespace``, ``raw``) and ``_get_plan`` they use."""

    client: Any
    name: str
    namespace: str
    raw: dict[str, Any]
    _get_plan: Callable[[], Plan[GroupResult]]

    def _drive_plan(
        self, episodes: Episodes, concurrency: int | None, timeout: float | None, poll_interval: float
    ) -> Plan[DriveResult]:
        """Runs an episode for every trajectory Sandbox of the group as it becomes Ready (later strides
        included), at most ``concurrency`` at once, until the group is recorded; answers the group with
        every episode's outcome and payload. On any exception (a cancellation included), deletes the
        group's trajectory Sandboxes that have no result yet, then raises it."""
        if concurrency is not None and concurrency < 1:
            raise ValueError("concurrency must be at least 1 (or None: no limit)")
        if not (self.raw.get("spec") or {}).get("template"):
            yield from self._get_plan()
        if _ops.template_runs(self.raw):
            raise ValueError(
                f"rollout group {self.namespace}/{self.name} has template.spec.run: the operator runs each "
                "trajectory and records its result; drive() is for groups whose template has no run"
            )
        book = DriveBook(self.name)
        outcomes: list[EpisodeOutcome] = []
        selector = f"{_ops.ROLLOUT_GROUP_LABEL}={self.name}"
        deadline = None if timeout is None else (yield NOW) + timeout
        try:
            while True:
                failures = yield Call(episodes.reap)
                if failures:
                    raise failures[0]
                items = yield from self.client._list_plan("sandboxes", selector, self.namespace)
                slots = None if concurrency is None else concurrency - (yield Call(episodes.running))
                for raw in book.select(items, slots):
                    sandbox = self.client._handle(raw["metadata"]["name"], self.namespace, raw, False, True, None)
                    yield Call(functools.partial(episodes.start, sandbox, outcomes.append))
                wait = poll_interval
                if deadline is not None:
                    remaining = deadline - (yield NOW)
                    if remaining <= 0:
                        raise Timeout(f"rollout group {self.namespace}/{self.name} not complete after {timeout}s")
                    wait = min(wait, remaining)
                done, answer = yield from self.client._server_wait_plan(
                    _ops.group_path(self.namespace, self.name, "/wait"), wait
                )
                if done:
                    self.raw = answer
                    yield Call(episodes.settle)
                    return DriveResult.of(GroupResult.from_json(self.raw), outcomes)
        except BaseException:
            yield Call(episodes.abandon)
            yield from self._delete_unfinished_plan(selector)
            raise

    def _delete_unfinished_plan(self, selector: str) -> Plan[None]:
        """Best effort: deletes the group's trajectory Sandboxes that have no result (still running)."""
        try:
            items = yield from self.client._list_plan("sandboxes", selector, self.namespace)
        except OrchardError as error:
            log.warning("cannot list the trajectories of %s/%s to delete them: %s", self.namespace, self.name, error)
            return
        for item in items:
            meta = item.get("metadata") or {}
            name = str(meta.get("name", ""))
            if _ops.trajectory_index(self.name, name) is None or meta.get("deletionTimestamp"):
                continue
            if (item.get("status") or {}).get("result"):
                continue
            try:
                yield from self.client._delete_plan(name, self.namespace)
            except NotFound:
                pass
            except OrchardError as error:
                log.warning("cannot delete trajectory %s/%s: %s", self.namespace, name, error)

    def _episode_plan(
        self, sandbox: Any, episode: Callable[[Any], Any], record: Callable[[EpisodeOutcome], None]
    ) -> Plan[dict[str, Any]]:
        """Runs ``episode(sandbox)`` once (a :class:`Call`: never retried) while heartbeating the sandbox,
        and records its outcome: what it returned (:func:`_ops.result_body` of the result, the payload of a
        ``(result, payload)`` pair kept aside, never sent), or ``aborted`` with the exception when it raised.
        A sandbox already gone, or a result already recorded (the controller aborted the trajectory
        meanwhile), is logged, not raised. Hands the :class:`EpisodeOutcome` to ``record`` however the plan
        ends (a cancellation included); answers the body it posted."""
        sandbox._start_heartbeats()
        index = _ops.trajectory_index(self.name, sandbox.name)
        body: dict[str, Any] | None = None
        payload: Any = None
        failure: BaseException | None = None
        recorded = False
        try:
            try:
                result, payload = _ops.split_episode_value((yield Call(functools.partial(episode, sandbox))))
                body = _ops.result_body(result)
            except Exception as error:
                log.warning("episode of %s/%s failed: %r", sandbox.namespace, sandbox.name, error)
                failure, payload = error, None
                body = _ops.aborted_body(error)
            try:
                yield from sandbox._gateway("POST", "/result", json_body=body)
                recorded = True
            except (NotFound, Conflict) as error:
                log.info("result of %s/%s not recorded: %s", sandbox.namespace, sandbox.name, error)
        except BaseException as error:  # cancelled (async), or the post failed otherwise: drive stops
            failure = failure or error
            raise
        finally:
            record(EpisodeOutcome(
                name=sandbox.name, index=-1 if index is None else index,
                result=None if body is None else TrajectoryResult.from_json(body), payload=payload,
                error=failure, recorded=recorded,
            ))
            yield Call(sandbox.stop_heartbeats)
        return body

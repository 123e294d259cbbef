"""Function calls: inputs waiting for a container, outputs waiting for the caller.

A call (`fc-…`) is what FunctionMap creates: `.remote()`/`.spawn()` send one input with it
(pipelined), `.map()` sends its inputs with FunctionPutInputs afterwards. Each input
(`in-…`) is queued on its function's pool until a container asks for work
(FunctionGetInputs); the container answers with FunctionPutOutputs, and the caller long-polls
FunctionGetOutputs (one index for `.remote()`, "everything after entry N" for `.map()`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from modal_proto import api_pb2

from emulator.ids import new_id


@dataclass
class PendingInput:
    input_id: str
    call_id: str
    idx: int
    function_id: str
    input: api_pb2.FunctionInput
    retry_count: int = 0
    task_id: str = ""  # the container working on it
    started_at: float = 0.0


@dataclass
class Output:
    entry: int
    item: api_pb2.FunctionGetOutputsItem


@dataclass
class FunctionCall:
    id: str
    function_id: str
    created_at: float = field(default_factory=time.time)
    inputs: dict[str, PendingInput] = field(default_factory=dict)
    outputs: list[Output] = field(default_factory=list)
    finished: set[str] = field(default_factory=set)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    next_entry: int = 1
    #: Web endpoint calls: ASGI messages to the app (data in) and from it (data out), as
    #: (index, data format, serialized message); indexes start at 1, as the client expects.
    data_in: list[tuple[int, int, bytes]] = field(default_factory=list)
    data_out: list[tuple[int, int, bytes]] = field(default_factory=list)
    #: The highest data-in index the container has received (it asks for what follows it:
    #: FunctionCallGetDataIn's `last_index`); what is at or below it is dropped.
    data_in_taken: int = 0

    @property
    def unfinished(self) -> int:
        return len(self.inputs) - len(self.finished)

    def notify(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def data_in_unread(self) -> int:
        """Bytes of data-in messages the container has not received yet."""
        return sum(len(c[2]) for c in self.data_in if c[0] > self.data_in_taken)

    def data_in_received(self, last_index: int) -> None:
        """The container asked for what follows `last_index`: it has everything up to it
        (its retries ask again after its own last index, never before), so that is dropped
        and the edge may read more of the client's body."""
        if last_index > self.data_in_taken:
            self.data_in_taken = last_index
            self.data_in = [c for c in self.data_in if c[0] > last_index]
            self.notify()


class Calls:
    """Every function call the emulator knows, and the input queues of each function."""

    def __init__(self) -> None:
        self.calls: dict[str, FunctionCall] = {}
        self.by_input: dict[str, PendingInput] = {}
        self.queues: dict[str, deque[PendingInput]] = {}
        self.queue_changed: dict[str, asyncio.Event] = {}

    def create(self, function_id: str) -> FunctionCall:
        call = FunctionCall(id=new_id("function_call"), function_id=function_id)
        self.calls[call.id] = call
        return call

    def get(self, call_id: str) -> FunctionCall | None:
        return self.calls.get(call_id)

    def forget(self, call_id: str) -> None:
        """Drop a finished call (web requests: once answered)."""
        call = self.calls.pop(call_id, None)
        if call is not None:
            for input_id in call.inputs:
                self.by_input.pop(input_id, None)

    def add_input(self, call: FunctionCall, idx: int, item: api_pb2.FunctionInput) -> PendingInput:
        pending = PendingInput(new_id("input"), call.id, idx, call.function_id, item)
        call.inputs[pending.input_id] = pending
        self.by_input[pending.input_id] = pending
        self.queue(call.function_id).append(pending)
        self._wake(call.function_id)
        return pending

    def requeue(self, pending: PendingInput) -> None:
        pending.task_id = ""
        pending.retry_count += 1
        self.queue(pending.function_id).appendleft(pending)
        self._wake(pending.function_id)

    def queue(self, function_id: str) -> deque[PendingInput]:
        return self.queues.setdefault(function_id, deque())

    def queue_event(self, function_id: str) -> asyncio.Event:
        return self.queue_changed.setdefault(function_id, asyncio.Event())

    def _wake(self, function_id: str) -> None:
        event = self.queue_event(function_id)
        event.set()
        self.queue_changed[function_id] = asyncio.Event()

    def wake(self, function_id: str) -> None:
        self._wake(function_id)

    def pop(self, function_id: str) -> PendingInput | None:
        q = self.queue(function_id)
        return q.popleft() if q else None

    def complete(
        self,
        input_id: str,
        result: api_pb2.GenericResult,
        data_format: int,
        task_id: str = "",
        started_at: float = 0.0,
        retry_count: int = 0,
    ) -> PendingInput | None:
        pending = self.by_input.get(input_id)
        if pending is None:
            return None
        call = self.calls.get(pending.call_id)
        if call is None or input_id in call.finished:
            return pending
        call.finished.add(input_id)
        item = api_pb2.FunctionGetOutputsItem(
            result=result,
            idx=pending.idx,
            input_id=input_id,
            data_format=data_format,  # type: ignore[arg-type]
            task_id=task_id,
            input_started_at=started_at or pending.started_at,
            output_created_at=time.time(),
            retry_count=retry_count,
        )
        call.outputs.append(Output(call.next_entry, item))
        call.next_entry += 1
        call.notify()
        return pending

    def fail_queued(self, function_id: str, message: str, traceback: str = "") -> int:
        """Fail every input still waiting for a container of `function_id`; how many."""
        q = self.queue(function_id)
        n = 0
        while q:
            pending = q.popleft()
            self.complete(pending.input_id, failure(message, traceback), api_pb2.DATA_FORMAT_PICKLE)
            n += 1
        return n

    def fail_task(self, task_id: str, message: str) -> None:
        """A container died: its inputs in flight fail (Modal would retry per retry policy)."""
        for pending in list(self.by_input.values()):
            if pending.task_id == task_id:
                call = self.calls.get(pending.call_id)
                if call is not None and pending.input_id not in call.finished:
                    self.complete(
                        pending.input_id,
                        failure(message),
                        api_pb2.DATA_FORMAT_PICKLE,
                        task_id=task_id,
                    )

    def drop_function(self, function_id: str) -> None:
        self.queues.pop(function_id, None)

    def clear(self) -> None:
        self.calls.clear()
        self.by_input.clear()
        self.queues.clear()


def failure(message: str, traceback: str = "") -> api_pb2.GenericResult:
    return api_pb2.GenericResult(
        status=api_pb2.GenericResult.GENERIC_STATUS_INTERNAL_FAILURE,
        exception=message,
        traceback=traceback,
    )

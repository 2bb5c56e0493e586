"""Pipelines of requests through a graph: ``GraphRunner.map``.

    async with runner.map(requests, stream=stream, max_in_flight=4) as results:
        async for outputs in results:                                     # in input order
            ...

At most ``max_in_flight`` requests are in flight (started, not yet handed to the consumer), and
results come out in input order. A plain iterable is pulled by the consumer's own task: entering
starts the first ``max_in_flight`` requests, and each result taken starts the next before it is
returned. An async iterable may block, so a feeding task pulls it, with a memory channel of
``max_in_flight`` slot tokens as the backpressure (a request starts with a token, the consumer
hands it back when it takes the result). A request that goes as one recorded command (a graph
runner's, ``_recorded_request``) is submitted where it is pulled and its completion awaited by
the consumer: no task, no channel round trip of its own. Other requests run in tasks. Measured
on an H200 (bench_pipeline): with a feeding task and a task per request, ``map`` was slower than
awaiting the same requests one at a time.

The pipeline's work, the feeding task and the requests' tasks, runs in a nursery that the
``async with`` block opens, so none of it outlives the block: leaving it (the end of the inputs,
a ``break``, an exception, a cancellation of the consumer) or ``aclose()`` stops pulling inputs,
cancels the requests in flight and releases every buffer they hold before the block exits. There
is no bare ``async for`` over ``runner.map(...)``: work that an abandoned iteration started
would go on until garbage collection, owned by nobody.
"""

from __future__ import annotations

import collections.abc
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import attrs
import trio

from .._values._errors import ClosedError, InvalidArgumentError
from ._tensor import Tensor

__all__ = ["Pipeline", "PipelineStatistics"]

_USAGE = ("async with runner.map(inputs, stream=stream, max_in_flight=4) as results:\n"
          "    async for outputs in results: ...")


class _Request(Protocol):
    """One request as the pipeline starts it: ``GraphRunner``'s execution of one input dict
    (its outputs dict), or an engine pool's request (a ``PoolResult``)."""

    async def run(self) -> Any: ...


class _Submitted(Protocol):
    """A request already submitted (a recorded request): its result awaited by the consumer."""

    async def result(self) -> Any: ...

    def abandon(self) -> None: ...


@attrs.frozen
class PipelineStatistics:
    """Requests started and delivered so far, and the most ever in flight at once (started,
    not yet handed to the consumer)."""

    started: int
    delivered: int
    peak_in_flight: int

    @property
    def in_flight(self) -> int:
        return self.started - self.delivered


@attrs.define(eq=False)
class _Slot:
    """A request's place in the order: its result (or error) once done, or the end marker."""

    done: trio.Event = attrs.field(factory=trio.Event)
    result: Any = None
    error: BaseException | None = None
    end: bool = False
    handed: bool = False
    # A request submitted without a task: the consumer awaits its result itself.
    submitted: _Submitted | None = None
    # Its place among the inputs (from 0), for the note its error carries; None for the end.
    index: int | None = None

    @classmethod
    def ended(cls, error: BaseException | None = None, index: int | None = None) -> _Slot:
        """The slot that ends the pipeline: the inputs' end, or ``error`` (of the request at
        ``index``) in its place."""
        slot = cls(error=error, end=error is None, index=index)
        slot.done.set()
        return slot

    def discard(self) -> None:
        """Free the Tensors of a result nobody will take (an outputs dict, or a result object
        holding one as ``outputs``: an engine pool's ``PoolResult``), or give up a submitted
        request nobody will await."""
        if self.submitted is not None and not self.handed:
            self.submitted.abandon()
            self.submitted = None
        if self.result is not None and not self.handed:
            outputs = self.result if isinstance(self.result, dict) else getattr(self.result, "outputs", None)
            for value in (outputs or {}).values():
                if isinstance(value, Tensor):
                    value.memory.release()
            self.result = None


class Pipeline:
    """Results of ``GraphRunner.map``, in input order::

        async with runner.map(inputs, stream=stream, max_in_flight=4) as results:
            async for outputs in results:
                ...

    At most ``max_in_flight`` requests are in flight (started and not yet handed to the
    consumer); the next input is pulled only when the consumer takes a result. An error in a
    request or in the input iterable is raised at its place in the order, after the results
    before it, and closes the pipeline. ``await results.aclose()`` closes it inside the block;
    leaving the block closes it in any case. Closing cancels the requests in flight, releases
    their buffers and frees undelivered ``Tensor`` results, and the block exits only once that
    is done. A pipeline is entered once; ``statistics()`` stays readable after it closes.
    """

    def __init__(self, inputs, start: Callable[[Any], _Request], max_in_flight: int) -> None:
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise InvalidArgumentError(f"max_in_flight {max_in_flight!r} must be a positive integer")
        if not isinstance(inputs, (collections.abc.Iterable, collections.abc.AsyncIterable)):
            raise InvalidArgumentError(
                f"inputs is {type(inputs).__name__}; expected an iterable or async iterable of input dicts"
            )
        self._inputs = inputs
        self._start = start
        self._max_in_flight = max_in_flight
        self._state = "new"             # new, open, closed
        self._lifetime: contextlib.AbstractAsyncContextManager | None = None
        self._closing = False
        self._started = 0
        self._delivered = 0
        self._peak = 0
        self._feed_error: BaseException | None = None
        # A plain iterable is pulled by the consumer itself (``_top_up``): no feeding task, no
        # token round trip per request. An async iterable may block, so a task pulls it.
        self._sync = not isinstance(inputs, collections.abc.AsyncIterable)
        self._queue: collections.deque[_Slot] = collections.deque()  # sync: slots in start order
        self._iterator: Any = None
        self._exhausted = False

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    def statistics(self) -> PipelineStatistics:
        return PipelineStatistics(self._started, self._delivered, self._peak)

    # -- the block that owns the work ----------------------------------------------------------

    async def __aenter__(self) -> Pipeline:
        if self._state != "new":
            raise InvalidArgumentError(
                "this pipeline was entered already; call runner.map(...) again for another"
            )
        self._lifetime = self._open()
        return await self._lifetime.__aenter__()

    async def __aexit__(self, *exc_info) -> bool | None:
        assert self._lifetime is not None, "async with entered it"
        return await self._lifetime.__aexit__(*exc_info)

    @contextlib.asynccontextmanager
    async def _open(self) -> AsyncIterator[Pipeline]:
        # Backpressure: a request starts only with one of max_in_flight slot tokens, which the
        # consumer hands back when it takes the request's result; requests go to the consumer
        # in start order through a second channel (room for them all plus the end marker).
        self._tokens_send, self._tokens_recv = trio.open_memory_channel(self._max_in_flight)
        for _ in range(self._max_in_flight):
            self._tokens_send.send_nowait(None)
        self._send, self._recv = trio.open_memory_channel(self._max_in_flight + 1)
        self._scope = trio.CancelScope()
        self._finished = trio.Event()
        self._state = "open"
        raised: BaseException | None = None
        with trio.CancelScope() as guard:
            async with trio.open_nursery() as nursery:
                name = f"triodnn.graph pipeline {id(self):#x}"
                if self._sync:
                    self._requests = await nursery.start(self._host, name=name)
                    assert isinstance(self._inputs, collections.abc.Iterable), "sync mode"
                    self._iterator = iter(self._inputs)
                    self._top_up()
                else:
                    nursery.start_soon(self._feed, name=name)
                try:
                    yield self
                except BaseException as exc:
                    # Raised again below, as itself: out of the nursery it would come in a group.
                    raised = exc
                finally:
                    # Closing waits for the cancelled requests (a handler's worker thread
                    # finishing, say); no outer cancellation may cut that short, or their
                    # buffers would outlive the block.
                    guard.shield = True
                    await self.aclose()
        if raised is not None:
            raise raised

    async def aclose(self) -> None:
        """Stop pulling inputs and cancel the requests in flight; returns once they have ended,
        their buffers released and undelivered ``Tensor`` results freed. Iterating afterwards
        ends at once. Leaving the ``async with`` block does this too."""
        if self._state == "new":
            self._state = "closed"
            return
        if self._state == "open":
            self._state = "closed"
            if not self._finished.is_set():
                self._closing = True
                self._scope.cancel()
        await self._finished.wait()
        self._discard_undelivered()
        if self._sync and inspect.isgenerator(self._inputs):
            # As ``aclosing`` would: the generator's cleanup runs now, not at garbage collection.
            self._inputs.close()

    # -- the producer ----------------------------------------------------------------------------

    async def _host(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Sync mode: holds the nursery that requests needing a task of their own run in,
        under the scope closing cancels."""
        try:
            with self._scope:
                async with trio.open_nursery() as requests:
                    task_status.started(requests)
                    await trio.sleep_forever()
        finally:
            if self._closing:
                self._discard_undelivered()
            self._finished.set()

    def _top_up(self) -> None:
        """Sync mode: pull and start requests until ``max_in_flight`` are in flight (or the
        inputs end, or one fails to start: its error takes its place in the order)."""
        queue = self._queue
        while not self._exhausted and self._started - self._delivered < self._max_in_flight:
            try:
                item = next(self._iterator)
            except StopIteration:
                slot = _Slot.ended()
            except Exception as exc:
                slot = _Slot.ended(exc)
            else:
                slot = self._begin(item, self._requests)
            queue.append(slot)
            if slot.end or slot.error is not None:
                self._exhausted = True
                return

    def _begin(self, item, requests: trio.Nursery) -> _Slot:
        """The slot of ``item``'s request, started: a request recorded as one command is
        submitted now and its result awaited by the consumer (no task); others run in a task of
        ``requests``. One that fails to start ends the pipeline with its error, in its place."""
        index = self._started
        try:
            request = self._start(item)
            submit = getattr(request, "submit", None)
            submitted = submit() if submit is not None else None
        except Exception as exc:
            return _Slot.ended(exc, index)
        self._started += 1
        self._peak = max(self._peak, self._started - self._delivered)
        slot = _Slot(submitted=submitted, index=index)
        if submitted is None:
            requests.start_soon(self._request, slot, request)
        else:
            slot.done.set()
        return slot

    async def _feed(self) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as requests:
                    await self._pull(requests)
        except Exception as exc:
            # The input generator's aclose failed, or a bug here: the consumer gets it instead,
            # after the results delivered so far.
            self._closing = True
            self._feed_error = exc
        finally:
            self._send.close()
            if self._closing:
                self._discard_undelivered()
            self._finished.set()

    async def _pull(self, requests: trio.Nursery) -> None:
        """Async mode: pull and start a request whenever a slot token is free."""
        assert isinstance(self._inputs, collections.abc.AsyncIterable), "a plain iterable is pulled in sync mode"
        agen = self._inputs.__aiter__()
        try:
            while True:
                await self._tokens_recv.receive()
                try:
                    item = await agen.__anext__()
                except StopAsyncIteration:
                    self._send.send_nowait(_Slot.ended())
                    return
                except Exception as exc:
                    self._send.send_nowait(_Slot.ended(exc))
                    return
                slot = self._begin(item, requests)
                self._send.send_nowait(slot)
                if slot.error is not None:
                    return
        finally:
            # The pipeline consumed the iterable: close a generator it came from, as
            # ``aclosing`` would, so its cleanup runs now rather than at garbage collection.
            with trio.CancelScope(shield=True):
                if hasattr(agen, "aclose"):
                    await agen.aclose()

    async def _request(self, slot: _Slot, request: _Request) -> None:
        try:
            slot.result = await request.run()
        except Exception as exc:
            slot.error = exc
        finally:
            if self._closing:
                slot.discard()
            slot.done.set()

    def _discard_undelivered(self) -> None:
        while self._queue:
            self._queue.popleft().discard()
        while True:
            try:
                slot = self._recv.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return
            slot.discard()

    # -- the consumer ----------------------------------------------------------------------------

    def __aiter__(self) -> Pipeline:
        if self._state == "new":
            raise TypeError(
                "runner.map(...) returns a Pipeline to enter first; its requests run in a "
                f"nursery the block owns:\n{_USAGE}"
            )
        return self

    async def __anext__(self) -> Any:
        if self._state == "new":
            self.__aiter__()
        if self._state == "closed":
            raise StopAsyncIteration
        slot = None
        try:
            if self._sync:
                slot = self._queue.popleft() if self._queue else None
                if slot is None:
                    await trio.lowlevel.checkpoint()
            else:
                try:
                    slot = await self._recv.receive()
                except (trio.EndOfChannel, trio.ClosedResourceError):
                    slot = None
            if slot is not None:
                if slot.submitted is None:
                    await slot.done.wait()
                else:  # awaiting its result is the checkpoint: no scheduler pass of its own
                    submitted, slot.submitted = slot.submitted, None
                    try:
                        slot.result = await submitted.result()
                    except Exception as exc:
                        slot.error = exc
        except BaseException:
            # The consumer was cancelled (or interrupted) while waiting: close everything.
            with trio.CancelScope(shield=True):
                await self.aclose()
            if slot is not None:
                slot.discard()
            raise
        if slot is None or slot.end:
            await self.aclose()
            if slot is None and self._feed_error is not None:
                raise self._feed_error
            raise StopAsyncIteration
        if slot.error is not None:
            with trio.CancelScope(shield=True):
                await self.aclose()
            if slot.index is not None:
                # Which input failed, where the error itself cannot know (a missing key, a bad
                # shape, a device fault): a note, so the error keeps its type and message.
                slot.error.add_note(f"raised by request {slot.index} of the map's inputs (counting from 0)")
            raise slot.error
        if slot.result is None:      # cancelled under us: the pipeline is closing
            await self.aclose()
            raise ClosedError("the pipeline was closed")
        slot.handed = True
        self._delivered += 1
        if self._sync:
            self._top_up()                       # the next request starts before this returns
        else:
            self._tokens_send.send_nowait(None)  # the next request may start
        return slot.result

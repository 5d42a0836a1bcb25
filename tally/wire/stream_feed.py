"""A DoGet stream read with an idle deadline: a stream that makes progress may run long, one that
stalls is abandoned.

A Flight call's timeout (FlightCallOptions) is a gRPC deadline on the whole call: it would cut
a long scan that is making progress, and `read_chunk` takes no timeout of its own. So a thread
reads the stream into a small bounded queue, and the consumer waits on the queue for at most
`idle_timeout` per message: the wait for the schema (the server answers it once its snapshot is
replicated) and the wait for each next batch. A consumer that stops waiting cancels the call;
the thread ends once gRPC gives the call up (at once when it is streaming; a `do_get` blocked on
a server that never answers ends when keepalive closes the connection or the channel closes).

The bounded queue keeps flow control where it was: a slow consumer makes the thread wait, not
pile batches up, and that wait is not counted as the server's idleness.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.flight as flight

from tally.errors import TallyError, UnavailableError

# batches read ahead of the consumer: enough to overlap network and processing, few enough to
# keep a slow consumer's memory bounded
READ_AHEAD = 2
_POLL = 0.5  # how often a blocked reader thread checks whether its consumer went away


class StreamStalledError(UnavailableError):
    """A stream sent nothing for its idle deadline (the server is cut off, paused or wedged):
    abandoned, and retried elsewhere by callers that can resume it."""

    timed_out = True

    def __init__(self, message: str, server: str, channel=None) -> None:
        super().__init__(message)
        self.server = server
        self.channel = channel


class StreamFeed:
    """One DoGet call read by a thread; `schema()` then `batches()`, each wait bounded."""

    def __init__(self, start: Callable[[], flight.FlightStreamReader], address: str,
                 idle_timeout: float, failure: Callable[[BaseException], TallyError],
                 channel=None) -> None:
        """`start` makes the call (on the thread); `failure` turns a Flight error into the
        TallyError the caller raises; `channel`: the channel it runs on, named by a stall."""
        self._channel = channel
        self._start = start
        self.address = address
        self.idle_timeout = idle_timeout
        self._failure = failure
        self._queue: queue.Queue = queue.Queue(READ_AHEAD)
        self._abandoned = threading.Event()
        self._reader = None
        self._reader_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"tally-stream {address}",
                                        daemon=True)
        self._thread.start()

    # --- the reader thread --------------------------------------------------------------------

    def _run(self) -> None:
        try:
            reader = self._start()
            with self._reader_lock:
                self._reader = reader
                if self._abandoned.is_set():
                    reader.cancel()
                    return
            self._put(("schema", reader.schema))
            while not self._abandoned.is_set():
                try:
                    chunk = reader.read_chunk()
                except StopIteration:
                    self._put(("end", None))
                    return
                if chunk.data is not None:
                    self._put(("batch", chunk.data))
        except (flight.FlightError, pa.ArrowException) as e:
            if not self._abandoned.is_set():
                self._put(("error", self._failure(e)))
        except BaseException as e:  # noqa: BLE001 - the consumer raises it, typed
            if not self._abandoned.is_set():
                self._put(("error", TallyError(f"reading a stream from {self.address} failed: "
                                               f"{type(e).__name__}: {e}")))

    def _put(self, item) -> None:
        while not self._abandoned.is_set():
            try:
                self._queue.put(item, timeout=_POLL)
                return
            except queue.Full:
                continue

    # --- the consumer -------------------------------------------------------------------------

    def _next(self, waiting_for: str):
        try:
            return self._queue.get(timeout=self.idle_timeout)
        except queue.Empty:
            self.abandon()
            raise StreamStalledError(
                f"{self.address} sent nothing for {self.idle_timeout:g} s while a stream "
                f"waited for {waiting_for} (the server is cut off, paused or overloaded): "
                "abandoned (the client's `stream_idle_timeout`)", self.address,
                self._channel) from None

    def schema(self) -> pa.Schema:
        kind, value = self._next("its first answer")
        if kind == "error":
            raise value
        return value

    def batches(self) -> Iterator[pa.RecordBatch]:
        try:
            while True:
                kind, value = self._next("its next batch")
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
        finally:
            self.abandon()

    def abandon(self) -> None:
        """Stop reading: cancel the call (the server stops streaming) and let the thread go."""
        self._abandoned.set()
        with self._reader_lock:
            reader = self._reader
        if reader is not None:
            try:
                reader.cancel()
            except (flight.FlightError, pa.ArrowException):
                pass

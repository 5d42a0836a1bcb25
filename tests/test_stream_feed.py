"""A stream read through a channel: one that stalls is abandoned with StreamStalledError naming
its server, one that makes progress is read whole, and the channel's keepalive options are
accepted by a real Flight server (an in-process pyarrow Flight server; no mocks)."""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from tally.wire.channel import FlightChannel, timed_out
from tally.wire.messages import parse_ticket
from tally.wire.stream_feed import StreamStalledError

SCHEMA = pa.schema([("x", pa.int64())])


class Stalling(flight.FlightServerBase):
    """Streams `n` batches from the ticket, then waits for `release` before the rest."""

    def __init__(self) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.release = threading.Event()

    def do_get(self, context, ticket):
        first = parse_ticket(ticket)[0]["n"]

        def batches():
            for i in range(first):
                yield pa.record_batch([pa.array([i])], schema=SCHEMA)
            self.release.wait(60)
            yield pa.record_batch([pa.array([first])], schema=SCHEMA)

        return flight.GeneratorStream(SCHEMA, batches())


@pytest.fixture
def server():
    s = Stalling()
    yield s
    s.release.set()
    s.shutdown()


def test_a_stream_that_stalls_midway_is_abandoned_naming_its_server(server):
    channel = FlightChannel(f"grpc://127.0.0.1:{server.port}", stream_idle_timeout=0.5)
    try:
        _schema, batches = channel.stream({"n": 3})
        read = []
        with pytest.raises(StreamStalledError) as stalled:
            for batch in batches:
                read.extend(batch.column(0).to_pylist())
        assert read == list(range(len(read)))  # what arrived (gRPC may hold some back), in order
        assert stalled.value.server == channel.address and timed_out(stalled.value)
        assert "stream_idle_timeout" in str(stalled.value)
    finally:
        channel.close()


def test_a_stream_that_makes_progress_is_read_whole(server):
    server.release.set()
    channel = FlightChannel(f"grpc://127.0.0.1:{server.port}", stream_idle_timeout=60)
    try:
        schema, batches = channel.stream({"n": 5})
        assert schema.names == ["x"]
        assert [v for b in batches for v in b.column(0).to_pylist()] == [0, 1, 2, 3, 4, 5]
    finally:
        channel.close()

"""A read's `client.*-timeout` options: parsed into tally.connect's keywords (batch and
changelog reads alike), a bad duration refused naming the option."""

from __future__ import annotations

import pytest

from sink.batch_reader import ReadOptions
from sink.stream_reader import StreamOptions
from tally.errors import InvalidOptionError

BASE = {"url": "grpc://127.0.0.1:1", "table": "db.t"}


def test_client_timeouts_reach_the_connection_keywords():
    read = ReadOptions.parse({**BASE, "client.Request-Timeout": "5s",
                              "client.retry-timeout": "2min"})
    assert dict(read.timeouts) == {"request_timeout": 5.0, "retry_timeout": 120.0}
    stream = StreamOptions.parse({**BASE, "client.stream-idle-timeout": "500ms"})
    assert dict(stream.timeouts) == {"stream_idle_timeout": 0.5}
    assert ReadOptions.parse(BASE).timeouts == ()


@pytest.mark.parametrize("value", ["0", "-1", "soon", "inf"])
def test_a_bad_client_timeout_is_refused_naming_the_option(value):
    with pytest.raises(InvalidOptionError, match="client.request-timeout"):
        ReadOptions.parse({**BASE, "client.request-timeout": value})

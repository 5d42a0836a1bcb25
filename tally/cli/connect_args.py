"""How every client command reaches a cluster: `--url` (default `$TALLY_URL`), the token
(tally.cli.token_source) and the TLS files (tally.cli.tls_source), all in one place so every
command takes them the same way."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from tally.cli.tls_source import add_tls_arguments, tls_files
from tally.cli.token_source import add_token_arguments, client_token
from tally.errors import InvalidOptionError


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get("TALLY_URL"),
                        help="the coordinator's URL, grpc://HOST:PORT or grpc+tls://HOST:PORT "
                             "(default $TALLY_URL)")
    add_token_arguments(parser)
    add_tls_arguments(parser)


def open_connection(args: argparse.Namespace):
    """A client connection from the arguments. Client log lines (each retry of a server that
    is away) go to stderr as `tally: ...`; `--verbose` adds the first contact's retries."""
    if not args.url:
        raise InvalidOptionError("no cluster address: give --url grpc://HOST:PORT or set "
                                 "$TALLY_URL")
    _log_to_stderr(logging.INFO if getattr(args, "verbose", False) else logging.WARNING)
    from tally import client

    token, tls = client_token(args), tls_files(args)
    try:
        return client.connect(args.url, token=token, tls=tls)
    except ValueError as e:  # a URL the client cannot parse (pyarrow's ArrowInvalid is one too)
        raise InvalidOptionError(f"--url {args.url!r}: {e}") from None


class _CurrentStderr(logging.StreamHandler):
    """A handler writing to whatever sys.stderr is when a record comes (so a caller that
    swaps stderr, as tests capturing output do, gets the lines)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def _log_to_stderr(level: int) -> None:
    logger = logging.getLogger("tally.client")
    if not any(isinstance(h, _CurrentStderr) for h in logger.handlers):
        handler = _CurrentStderr()
        handler.setFormatter(logging.Formatter("tally: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)

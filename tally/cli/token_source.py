"""Where the `tally` client commands find their token: a file or the environment, never argv.

`--token-file PATH` (default `$TALLY_TOKEN_FILE`) holds the token on its first line; without a
file, `$TALLY_TOKEN` holds it. A token on the command line would be in the process list, which
every local user can read; a process's environment is readable by its own user only.
"""

from __future__ import annotations

import argparse
import os

from tally.errors import InvalidOptionError


def add_token_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token-file", metavar="PATH", default=os.environ.get("TALLY_TOKEN_FILE"),
                        help="a file holding the client token (default: $TALLY_TOKEN_FILE, "
                             "else the token in $TALLY_TOKEN, else none)")


def client_token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        try:
            with open(args.token_file) as f:
                token = f.readline().strip()
        except OSError as e:
            raise InvalidOptionError(f"--token-file {args.token_file}: {e.strerror}") from None
        if not token:
            raise InvalidOptionError(f"--token-file {args.token_file} holds no token on its "
                                     "first line")
        return token
    return os.environ.get("TALLY_TOKEN") or None

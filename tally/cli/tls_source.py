"""Where a `tally` command finds the TLS files of a grpc+tls:// cluster: flags, else the
environment (paths only: a certificate's key stays in its file)."""

from __future__ import annotations

import argparse
import os


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """How a command reaches a grpc+tls:// cluster (PEM paths; defaults from the environment)."""
    parser.add_argument("--tls-ca", metavar="PEM", default=os.environ.get("TALLY_TLS_CA"),
                        help="the CA that verifies the cluster (default $TALLY_TLS_CA, else "
                             "the system's roots)")
    parser.add_argument("--tls-cert", metavar="PEM", default=os.environ.get("TALLY_TLS_CERT"),
                        help="a client certificate, for mutual TLS (default $TALLY_TLS_CERT)")
    parser.add_argument("--tls-key", metavar="PEM", default=os.environ.get("TALLY_TLS_KEY"),
                        help="its private key (default $TALLY_TLS_KEY)")


def tls_files(args: argparse.Namespace):
    """The TlsFiles the arguments name, or None (then a grpc+tls:// URL uses system roots)."""
    if not (args.tls_ca or args.tls_cert or args.tls_key):
        return None
    from tally.wire.tls import TlsFiles

    return TlsFiles(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key)

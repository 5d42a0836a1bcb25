"""TLS on every hop, with a throwaway CA and certificates made here (the `cryptography` package).

A TLS cluster serves only grpc+tls://: its tablet servers reach the coordinator, and the
coordinator its tablet servers, over TLS; a client that trusts the CA writes and reads. A
plaintext client, a client trusting another CA, and (with mutual TLS) a client without a
certificate from the cluster's CA are refused; a TLS connection never calls a plaintext address.
"""

from __future__ import annotations

import datetime
import ipaddress

import pyarrow as pa
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import tally
from tally.errors import AuthenticationError
from tally.wire.channel import FlightChannel
from tally.wire.tls import TlsFiles

HOST = "127.0.0.1"


class Authority:
    """A CA that signs certificates for 127.0.0.1 / localhost into PEM files."""

    def __init__(self, directory, name: str) -> None:
        self.directory = directory
        self.name = name
        self.key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
        self.cert = (self._builder(subject, subject, self.key.public_key())
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                     .sign(self.key, hashes.SHA256()))
        self.ca_file = self._write(f"{name}-ca.pem", self.cert.public_bytes(
            serialization.Encoding.PEM))

    @staticmethod
    def _builder(subject, issuer, public_key) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.timezone.utc)
        return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
                .public_key(public_key).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=2)))

    def _write(self, name: str, data: bytes) -> str:
        path = self.directory / name
        path.write_bytes(data)
        return str(path)

    def issue(self, name: str) -> tuple[str, str]:
        """(certificate file, key file) for `name`, valid for server and client use."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (self._builder(subject, self.cert.subject, key.public_key())
                .add_extension(x509.SubjectAlternativeName([
                    x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]),
                    False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]), False)
                .sign(self.key, hashes.SHA256()))
        key_pem = key.private_bytes(serialization.Encoding.PEM,
                                    serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        return (self._write(f"{self.name}-{name}.pem",
                            cert.public_bytes(serialization.Encoding.PEM)),
                self._write(f"{self.name}-{name}.key", key_pem))


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pki")
    return Authority(directory, "cluster"), Authority(directory, "rogue")


def server_tls(authority: Authority, verify_clients: bool) -> TlsFiles:
    cert, key = authority.issue("server")
    return TlsFiles(ca=authority.ca_file, cert=cert, key=key, verify_clients=verify_clients)


@pytest.fixture(scope="module")
def tls_cluster(pki, tmp_path_factory):
    with tally.LocalCluster(str(tmp_path_factory.mktemp("tls")), tablet_servers=2,
                            tls=server_tls(pki[0], verify_clients=False)) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def mutual_cluster(pki, tmp_path_factory):
    with tally.LocalCluster(str(tmp_path_factory.mktemp("mtls")), tablet_servers=1,
                            tls=server_tls(pki[0], verify_clients=True)) as cluster:
        yield cluster


def write_and_read(conn, name: str) -> list[dict]:
    schema = (tally.Schema.builder().column("k", pa.int64())
              .agg_column("v", pa.int64(), tally.AggFunction.SUM).primary_key("k").build())
    conn.admin.create_table(name, tally.TableDescriptor(
        schema, bucket_count=4, properties={"table.merge-engine": "aggregation"}))
    with conn.table(name).upsert_writer() as writer:
        writer.upsert([{"k": k % 5, "v": k} for k in range(20)])
    return conn.table(name).to_arrow().to_pylist()


def expected() -> list[dict]:
    return [{"k": k, "v": sum(i for i in range(20) if i % 5 == k)} for k in range(5)]


def test_a_tls_cluster_serves_clients_that_trust_its_ca(pki, tls_cluster):
    assert tls_cluster.url.startswith("grpc+tls://")
    with tally.connect(tls_cluster.url, tls=TlsFiles(ca=pki[0].ca_file)) as conn:
        servers = conn.coordinator_action("list_servers")
        assert servers and all(s["address"].startswith("grpc+tls://") for s in servers)
        assert write_and_read(conn, "default.tls_rows") == expected()


def test_a_plaintext_client_is_refused(tls_cluster):
    plain = tls_cluster.url.replace("grpc+tls://", "grpc://")
    with pytest.raises(AuthenticationError, match="closes every connection at once"):
        tally.connect(plain)


def test_a_client_trusting_another_ca_is_refused(pki, tls_cluster):
    with pytest.raises(AuthenticationError, match="TLS"):
        tally.connect(tls_cluster.url, tls=TlsFiles(ca=pki[1].ca_file))


def test_a_tls_connection_never_calls_a_plaintext_address(pki):
    with pytest.raises(AuthenticationError, match="without TLS"):
        FlightChannel(f"grpc://{HOST}:1", "secret", tls=TlsFiles(ca=pki[0].ca_file))


def test_mutual_tls_refuses_clients_without_a_certificate_of_the_cluster_ca(pki, mutual_cluster):
    ca = pki[0].ca_file
    with pytest.raises(AuthenticationError, match="client certificate"):
        tally.connect(mutual_cluster.url, tls=TlsFiles(ca=ca))
    rogue_cert, rogue_key = pki[1].issue("client")
    with pytest.raises(AuthenticationError):
        tally.connect(mutual_cluster.url, tls=TlsFiles(ca=ca, cert=rogue_cert, key=rogue_key))
    cert, key = pki[0].issue("client")
    with tally.connect(mutual_cluster.url, tls=TlsFiles(ca=ca, cert=cert, key=key)) as conn:
        assert write_and_read(conn, "default.mtls_rows") == expected()


def test_tls_files_are_checked_before_use(tmp_path):
    from tally.errors import InvalidOptionError

    with pytest.raises(InvalidOptionError, match="both a certificate and its private key"):
        TlsFiles(cert=str(tmp_path / "c.pem"))
    with pytest.raises(InvalidOptionError, match="needs the CA"):
        TlsFiles(cert="c", key="k", verify_clients=True)
    with pytest.raises(InvalidOptionError, match="cannot read the TLS CA file"):
        TlsFiles(ca=str(tmp_path / "missing.pem")).client_options()


def test_the_cli_and_the_sink_options_reach_a_tls_cluster(pki, tls_cluster):
    import os
    import subprocess
    import sys

    from sink.options import SinkOptions

    env = {**os.environ, "TALLY_TLS_CA": pki[0].ca_file}
    done = subprocess.run([sys.executable, "-m", "tally.cli.main", "servers", "--url",
                           tls_cluster.url], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("live") == 2 and "grpc+tls://" in done.stdout
    options = SinkOptions.parse({"url": tls_cluster.url, "table": "default.t",
                                 "tls.ca": pki[0].ca_file})
    assert options.tls == TlsFiles(ca=pki[0].ca_file)
    with tally.connect(options.url, tls=options.tls) as conn:
        assert conn.admin.list_databases()

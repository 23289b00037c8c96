"""TLS and mutual TLS between monitor and agent: a real `iepm agent` with certificates from a
private CA made here, and the monitor's client with and without the right credentials."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from iepm.errors import RemoteError
from iepm.remote.client import AgentClient, Refusal
from testkit.agent import RunningAgent, running_agent

pytestmark = pytest.mark.servers

NOW = dt.datetime.now(dt.UTC)


@dataclass
class Issued:
    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: str, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, *, ca: bool
) -> x509.CertificateBuilder:
    """A certificate valid for a day from five minutes ago."""
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(minutes=5))
        .not_valid_after(NOW + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Issued:
    cert_path, key_path = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    return Issued(cert_path, key_path)


class Authority:
    """A private CA that issues server and client certificates."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.cert = (
            _builder(name, _name(name), self.key, ca=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        self.path = _write(directory, name, self.cert, self.key).cert

    def issue(self, stem: str, *, server_ip: str | None = None) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server_ip else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            _builder(stem, self.cert.subject, key, ca=False)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if server_ip:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(server_ip))]),
                critical=False,
            )
        return _write(self.directory, stem, builder.sign(self.key, hashes.SHA256()), key)


@dataclass
class Pki:
    ca: Authority
    rogue: Authority  # a CA the agent does not trust
    server: Issued
    client: Issued
    rogue_client: Issued


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca, rogue = Authority(directory, "iepm-test-ca"), Authority(directory, "rogue-ca")
    return Pki(
        ca,
        rogue,
        ca.issue("agent", server_ip="127.0.0.1"),
        ca.issue("monitor"),
        rogue.issue("intruder"),
    )


@pytest.fixture(scope="module")
def mtls_agent(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    tls = {
        "tls_cert": str(pki.server.cert),
        "tls_key": str(pki.server.key),
        "tls_client_ca": str(pki.ca.path),
    }
    with running_agent(tmp_path_factory.mktemp("mtls-agent"), tls=tls) as agent:
        yield agent


@pytest.fixture(scope="module")
def tls_agent(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAgent]:
    tls = {"tls_cert": str(pki.server.cert), "tls_key": str(pki.server.key)}
    with running_agent(tmp_path_factory.mktemp("tls-agent"), tls=tls) as agent:
        yield agent


def _client(agent: RunningAgent, *, ca: Path | None, cert: Issued | None) -> AgentClient:
    return AgentClient(
        agent.url,
        agent.tokens["mon1"],
        timeout_s=5.0,
        ca_file=str(ca) if ca else None,
        client_cert=str(cert.cert) if cert else None,
        client_key=str(cert.key) if cert else None,
    )


def test_mutual_tls_with_the_monitor_certificate_works(mtls_agent: RunningAgent, pki: Pki) -> None:
    client = _client(mtls_agent, ca=pki.ca.path, cert=pki.client)
    assert mtls_agent.url.startswith("https://")
    assert asyncio.run(client.health()).status == "ok"
    # Facts need a known monitor's token as well: the certificate is on top of it.
    assert asyncio.run(client.facts()).agent == "test-agent"


def test_mutual_tls_still_requires_the_token(mtls_agent: RunningAgent, pki: Pki) -> None:
    client = AgentClient(
        mtls_agent.url,
        "not-a-token",
        timeout_s=5.0,
        ca_file=str(pki.ca.path),
        client_cert=str(pki.client.cert),
        client_key=str(pki.client.key),
    )
    with pytest.raises(Refusal) as refused:
        asyncio.run(client.facts())
    assert refused.value.status == 401


@pytest.mark.parametrize("who", ["no certificate", "certificate from another CA"])
def test_mutual_tls_refuses_a_monitor_without_a_trusted_certificate(
    mtls_agent: RunningAgent, pki: Pki, who: str
) -> None:
    cert = None if who == "no certificate" else pki.rogue_client
    client = _client(mtls_agent, ca=pki.ca.path, cert=cert)
    with pytest.raises(RemoteError, match=mtls_agent.url):
        asyncio.run(client.facts())


def test_the_monitor_refuses_an_agent_it_cannot_verify(tls_agent: RunningAgent, pki: Pki) -> None:
    # Default trust (the system's CAs) and a foreign CA: neither vouches for the agent.
    for ca in (None, pki.rogue.path):
        with pytest.raises(RemoteError, match="CERTIFICATE_VERIFY_FAILED"):
            asyncio.run(_client(tls_agent, ca=ca, cert=None).health())
    # Trusting the agent's CA (server-side TLS only, no client certificate) works.
    assert asyncio.run(_client(tls_agent, ca=pki.ca.path, cert=None).health()).status == "ok"


def test_plain_http_to_a_tls_agent_gets_no_answer(tls_agent: RunningAgent) -> None:
    plain = AgentClient(tls_agent.url.replace("https://", "http://"), "x", timeout_s=5.0)
    with pytest.raises(RemoteError):
        asyncio.run(plain.health())

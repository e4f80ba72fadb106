"""The webhook's TLS material, made by gpuguard itself: a CA and a serving leaf it signs.

Pure functions of a clock's ``now`` (epoch seconds) and the current material, so every
step of a rotation is testable without waiting. ``next_material`` answers what the Secret
should hold next, or None when it holds what it should:

1. nothing (or something unreadable): a fresh CA and leaf;
2. the CA past its renewal point: a new CA, the old one kept beside it in the bundle
   (``previous_ca``) and the old leaf still served, so the API server trusts both while
   the new bundle reaches the MutatingWebhookConfiguration;
3. once that bundle is published: a leaf signed by the new CA;
4. once that leaf has served ``settle_s`` (every replica has reloaded it): the old CA goes;
5. the leaf past its renewal point, or its names changed: a new leaf from the same CA.

Keys are ECDSA P-256; a certificate is renewed at ``renew_at`` (2/3) of its life.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass, replace

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DAY_S = 86400.0
# The Secret's keys: tls.crt/tls.key as a kubernetes.io/tls Secret names them.
CA_CERT, CA_KEY, LEAF_CERT, LEAF_KEY, PREVIOUS_CA = (
    "ca.crt",
    "ca.key",
    "tls.crt",
    "tls.key",
    "ca-previous.crt",
)
SECRET_KEYS = (CA_CERT, CA_KEY, LEAF_CERT, LEAF_KEY, PREVIOUS_CA)


@dataclass(frozen=True)
class Lifetimes:
    """How long each certificate lives and when it is renewed (a fraction of its life);
    ``backdate_s``: not-before set this far back, for clocks a little behind ours;
    ``settle_s``: how long the old CA stays trusted after the new CA's leaf is made."""

    ca_s: float = 365 * DAY_S
    leaf_s: float = 30 * DAY_S
    renew_at: float = 2 / 3
    backdate_s: float = 300.0
    settle_s: float = 600.0


DEFAULT_LIFETIMES = Lifetimes()


@dataclass(frozen=True)
class Material:
    """PEM bytes, as the Secret holds them; ``previous_ca`` empty outside a CA rotation."""

    ca_cert: bytes
    ca_key: bytes
    leaf_cert: bytes
    leaf_key: bytes
    previous_ca: bytes = b""

    def ca_bundle(self) -> bytes:
        """What the API server must trust: the CA, and during a rotation the old one."""
        return self.ca_cert + self.previous_ca

    def as_secret_data(self) -> dict[str, bytes]:
        return dict(zip(SECRET_KEYS, self._values(), strict=True))

    def _values(self) -> tuple[bytes, ...]:
        return (self.ca_cert, self.ca_key, self.leaf_cert, self.leaf_key, self.previous_ca)


def material_from(data: dict[str, bytes]) -> Material | None:
    """The material in a Secret's (decoded) data; None when any part is missing or does
    not parse (then a fresh CA is made: nothing trusts an unreadable one)."""
    try:
        material = Material(
            data[CA_CERT], data[CA_KEY], data[LEAF_CERT], data[LEAF_KEY], data.get(PREVIOUS_CA, b"")
        )
        x509.load_pem_x509_certificate(material.ca_cert)
        x509.load_pem_x509_certificate(material.leaf_cert)
        keys = [serialization.load_pem_private_key(k, None) for k in (data[CA_KEY], data[LEAF_KEY])]
        if material.previous_ca:
            x509.load_pem_x509_certificate(material.previous_ca)
    except (KeyError, ValueError, TypeError):
        return None
    # Only what this module makes: a key of another kind is replaced, never signed with.
    return material if all(isinstance(k, ec.EllipticCurvePrivateKey) for k in keys) else None


def service_names(service: str, namespace: str) -> tuple[str, ...]:
    """The DNS names the API server may use for a Service."""
    return (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    )


def next_material(
    current: Material | None,
    now: float,
    names: tuple[str, ...],
    ips: tuple[str, ...] = (),
    *,
    lifetimes: Lifetimes = DEFAULT_LIFETIMES,
    published: bool = True,
) -> Material | None:
    """What the Secret should hold next (see the module's steps), None: keep ``current``.
    ``published``: the API server's caBundle holds ``current.ca_cert`` (a leaf from a new
    CA is served only then)."""
    if current is None:
        return fresh(now, names, ips, lifetimes)
    ca = x509.load_pem_x509_certificate(current.ca_cert)
    leaf = x509.load_pem_x509_certificate(current.leaf_cert)
    from_old_ca = leaf.issuer != ca.subject
    if from_old_ca:  # a CA rotation under way
        return _issue(current, now, names, ips, lifetimes) if published else None
    if current.previous_ca and now >= _start(leaf) + lifetimes.backdate_s + lifetimes.settle_s:
        return replace(current, previous_ca=b"")
    if _due(ca, now, lifetimes):
        new_ca_cert, new_ca_key = _make_ca(now, lifetimes)
        return replace(current, ca_cert=new_ca_cert, ca_key=new_ca_key, previous_ca=current.ca_cert)
    if _due(leaf, now, lifetimes) or _sans(leaf) != (set(names), set(ips)):
        return _issue(current, now, names, ips, lifetimes)
    return None


def fresh(
    now: float, names: tuple[str, ...], ips: tuple[str, ...], lifetimes: Lifetimes
) -> Material:
    ca_cert, ca_key = _make_ca(now, lifetimes)
    return _issue(Material(ca_cert, ca_key, b"", b""), now, names, ips, lifetimes)


def not_after(pem: bytes) -> float:
    """When a PEM certificate expires (epoch seconds)."""
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()


def serial(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


def _due(cert: x509.Certificate, now: float, lifetimes: Lifetimes) -> bool:
    """Past ``renew_at`` of the life from when it was made (not-before less the backdate)."""
    made, end = _start(cert) + lifetimes.backdate_s, cert.not_valid_after_utc.timestamp()
    return now >= made + lifetimes.renew_at * (end - made)


def _start(cert: x509.Certificate) -> float:
    return cert.not_valid_before_utc.timestamp()


def _sans(cert: x509.Certificate) -> tuple[set[str], set[str]]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set(), set()
    ips = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    return set(sans.get_values_for_type(x509.DNSName)), ips


def _make_ca(now: float, lifetimes: Lifetimes) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpuguard-webhook-ca-{int(now)}")])
    cert = (
        _builder(now, lifetimes.ca_s, lifetimes.backdate_s)
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _issue(
    current: Material, now: float, names: tuple[str, ...], ips: tuple[str, ...], life: Lifetimes
) -> Material:
    """A new leaf from ``current``'s CA, never outliving it."""
    ca = x509.load_pem_x509_certificate(current.ca_cert)
    ca_key = serialization.load_pem_private_key(current.ca_key, None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the webhook CA's key is not an ECDSA key")
    key = ec.generate_private_key(ec.SECP256R1())
    leaf_s = min(life.leaf_s, ca.not_valid_after_utc.timestamp() - now)
    sans: list[x509.GeneralName] = [x509.DNSName(name) for name in names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    subject = names[0] if names else "gpuguard-webhook"
    cert = (
        _builder(now, leaf_s, life.backdate_s)
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return replace(
        current, leaf_cert=cert.public_bytes(serialization.Encoding.PEM), leaf_key=_key_pem(key)
    )


def _builder(now: float, life_s: float, backdate_s: float) -> x509.CertificateBuilder:
    start = datetime.datetime.fromtimestamp(int(now - backdate_s), datetime.UTC)
    end = datetime.datetime.fromtimestamp(int(now + life_s), datetime.UTC)
    return (
        x509.CertificateBuilder()
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
    )


def _usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )

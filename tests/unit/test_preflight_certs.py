"""The webhook's certificates: made, renewed and rotated by the clock given, never waited for."""

from __future__ import annotations

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from gpuguard.preflight import certs
from gpuguard.preflight.certs import Lifetimes, Material, next_material

T0 = 1_800_000_000.0
NAMES = certs.service_names("gpuguard-controller-webhook", "gpuguard")
LIFE = Lifetimes(ca_s=3000.0, leaf_s=300.0, backdate_s=10.0, settle_s=60.0)


def load(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def issued_by(leaf_pem: bytes, ca_pem: bytes) -> bool:
    try:
        load(leaf_pem).verify_directly_issued_by(load(ca_pem))
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def step(current: Material | None, now: float, published: bool = True) -> Material:
    made = next_material(current, now, NAMES, ("127.0.0.1",), lifetimes=LIFE, published=published)
    assert made is not None
    return made


def test_service_names_are_every_form_the_api_server_may_use():
    assert NAMES == (
        "gpuguard-controller-webhook",
        "gpuguard-controller-webhook.gpuguard",
        "gpuguard-controller-webhook.gpuguard.svc",
        "gpuguard-controller-webhook.gpuguard.svc.cluster.local",
    )


def test_a_fresh_leaf_is_signed_by_the_ca_for_the_names_and_ips_given():
    material = step(None, T0)
    leaf = load(material.leaf_cert)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == list(NAMES)
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert issued_by(material.leaf_cert, material.ca_cert)
    assert load(material.ca_cert).extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert certs.not_after(material.leaf_cert) == T0 + 300
    assert load(material.leaf_cert).not_valid_before_utc.timestamp() == T0 - 10
    assert material.ca_bundle() == material.ca_cert
    assert certs.material_from(material.as_secret_data()) == material


def test_nothing_changes_before_two_thirds_of_the_leaf_life():
    material = step(None, T0)
    # 2/3 of its 300 s from when it was made (its not-before is backdated 10 s).
    due = T0 + 300 * 2 / 3
    assert next_material(material, due - 1, NAMES, ("127.0.0.1",), lifetimes=LIFE) is None
    renewed = step(material, due + 1)
    assert renewed.ca_cert == material.ca_cert
    assert certs.serial(renewed.leaf_cert) != certs.serial(material.leaf_cert)
    assert issued_by(renewed.leaf_cert, material.ca_cert)


def test_changed_names_make_a_new_leaf_at_once():
    material = step(None, T0)
    other = next_material(material, T0 + 1, ("other-svc",), lifetimes=LIFE)
    assert other is not None and other.ca_cert == material.ca_cert
    assert certs.serial(other.leaf_cert) != certs.serial(material.leaf_cert)


def test_a_leaf_never_outlives_its_ca():
    material = step(None, T0)
    late = T0 + 1990  # the CA ends at T0+3000, due at 2/3 of 3000 s: not yet
    renewed = step(material, late)
    assert renewed.ca_cert == material.ca_cert
    assert certs.not_after(renewed.leaf_cert) <= certs.not_after(material.ca_cert)


def test_a_ca_rotation_overlaps_old_and_new_until_the_new_leaf_has_settled():
    material = step(None, T0)
    ca_due = T0 + 3000 * 2 / 3 + 1
    # 1. A new CA; the old leaf still served; the bundle trusts both.
    rotating = step(material, ca_due)
    assert rotating.ca_cert != material.ca_cert
    assert rotating.leaf_cert == material.leaf_cert
    assert rotating.previous_ca == material.ca_cert
    assert rotating.ca_bundle() == rotating.ca_cert + material.ca_cert
    # 2. No leaf from the new CA until the bundle is published.
    unpublished = next_material(
        rotating, ca_due + 1, NAMES, ("127.0.0.1",), lifetimes=LIFE, published=False
    )
    assert unpublished is None
    # 3. Published: a leaf from the new CA, the old CA still trusted.
    swapped = step(rotating, ca_due + 2)
    assert issued_by(swapped.leaf_cert, swapped.ca_cert)
    assert swapped.previous_ca == material.ca_cert
    assert next_material(swapped, ca_due + 30, NAMES, ("127.0.0.1",), lifetimes=LIFE) is None
    # 4. After settle_s the old CA goes.
    settled = step(swapped, ca_due + 2 + LIFE.settle_s)
    assert settled.previous_ca == b""
    assert settled.ca_bundle() == swapped.ca_cert
    assert settled.leaf_cert == swapped.leaf_cert


def test_unreadable_secret_data_is_no_material():
    material = step(None, T0)
    data = material.as_secret_data()
    assert certs.material_from({}) is None
    assert certs.material_from({**data, certs.LEAF_CERT: b"garbage"}) is None
    assert certs.material_from({**data, certs.CA_KEY: b""}) is None
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    assert certs.material_from({**data, certs.CA_KEY: rsa_key}) is None  # not ours: remade

"""The webhook certificate's life in the cluster: one Secret, one caBundle, every replica.

Every ``every_s`` each replica reads the Secret and, when its leaf changed, loads it for
new handshakes. The leader (the controller's Lease) also moves the Secret one step on
(``certs.next_material``: make, renew, rotate the CA with an overlap) and writes the CA
bundle into the MutatingWebhookConfiguration's webhooks when it differs. Writes go
through the controller's fenced client, so a replica that lost the Lease writes nothing.
The chart makes the Secret and the configuration; the Secret is created here only when
missing (a cluster without the chart).
"""

from __future__ import annotations

import base64
import logging
import threading
from dataclasses import dataclass

from gpuguard.clock import SYSTEM_CLOCK, Clock
from gpuguard.kube.errors import KubeError
from gpuguard.kube.rest import Json, KubeApi, KubeNotFound, Resource
from gpuguard.preflight import certs
from gpuguard.preflight.certs import DEFAULT_LIFETIMES, Lifetimes, Material
from gpuguard.preflight.webhook_server import ServingCert

log = logging.getLogger("gpuguard.preflight")

SECRETS = Resource("/api/v1", "secrets", namespaced=True)
WEBHOOK_CONFIGS = Resource("/apis/admissionregistration.k8s.io/v1", "mutatingwebhookconfigurations")
EVERY_S = 30.0
QUICK_S = 1.0  # how soon a new leader, or a replica still without a certificate, looks


@dataclass(frozen=True)
class Place:
    """Where the material lives and whom it names: the Secret, the webhook configuration
    whose caBundle it fills ("": none), the certificate's DNS names and IP addresses."""

    namespace: str
    secret: str
    webhook_config: str
    names: tuple[str, ...]
    ips: tuple[str, ...] = ()


class Rotator:
    """``run(stop)``: one ``step`` now, then one every ``every_s``."""

    def __init__(
        self,
        api: KubeApi,
        place: Place,
        cert: ServingCert,
        leading: threading.Event,
        *,
        lifetimes: Lifetimes = DEFAULT_LIFETIMES,
        clock: Clock = SYSTEM_CLOCK,
        every_s: float = EVERY_S,
    ) -> None:
        self.api = api
        self.place = place
        self.cert = cert
        self.leading = leading
        self.lifetimes = lifetimes
        self.clock = clock
        self.every_s = every_s

    def run(self, stop: threading.Event) -> None:
        while True:
            try:
                self.step()
            except (KubeError, ValueError) as exc:  # ValueError: material made by hand
                log.warning("webhook certificate: %s (tried again in %.0f s)", exc, self.every_s)
            if self._rest(stop):
                return

    def _rest(self, stop: threading.Event) -> bool:
        """Wait ``every_s``, or less: a replica that just took the lead has a certificate
        to make, one without a certificate has one to load. True once ``stop`` is set."""
        led = self.leading.is_set()
        until = SYSTEM_CLOCK.monotonic() + self.every_s
        while not stop.wait(min(QUICK_S, max(0.0, until - SYSTEM_CLOCK.monotonic()))):
            if SYSTEM_CLOCK.monotonic() >= until or self.leading.is_set() != led:
                return False
            if not self.cert.served:
                return False
        return True

    def step(self) -> None:
        secret = self._read_secret()
        material = certs.material_from(_decoded(secret)) if secret is not None else None
        if self.leading.is_set():
            material = self._lead(secret, material)
        if material is not None and material.leaf_cert != self.cert.served:
            self.cert.load(material.leaf_cert, material.leaf_key)
            log.info("webhook certificate loaded (serial %x)", certs.serial(material.leaf_cert))

    def _lead(self, secret: Json | None, material: Material | None) -> Material | None:
        place = self.place
        published = material is None or self._published(material.ca_cert)
        made = certs.next_material(
            material,
            self.clock.now(),
            place.names,
            place.ips,
            lifetimes=self.lifetimes,
            published=published,
        )
        if made is not None:
            self._write_secret(secret, made)
            log.info("webhook certificate material written to Secret %s", place.secret)
            material = made
        if material is not None:
            self._publish(material.ca_bundle())
        return material

    def _read_secret(self) -> Json | None:
        try:
            return self.api.get(SECRETS.path(self.place.secret, namespace=self.place.namespace))
        except KubeNotFound:
            return None

    def _write_secret(self, secret: Json | None, material: Material) -> None:
        data = {k: base64.b64encode(v).decode() for k, v in material.as_secret_data().items()}
        place = self.place
        if secret is None:
            body: Json = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": place.secret, "namespace": place.namespace},
                "type": "Opaque",
                "data": data,
            }
            self.api.create(SECRETS.path(namespace=place.namespace), body)
            return
        # Conditional on the version read: two leaders a moment apart never interleave.
        body = {**secret, "data": data}
        self.api.replace(SECRETS.path(place.secret, namespace=place.namespace), body)

    def _webhooks(self) -> list[Json]:
        if not self.place.webhook_config:
            return []
        try:
            config = self.api.get(WEBHOOK_CONFIGS.path(self.place.webhook_config))
        except KubeNotFound:
            return []
        return [hook for hook in config.get("webhooks") or [] if isinstance(hook, dict)]

    def _published(self, ca_cert: bytes) -> bool:
        """Every webhook of the configuration trusts ``ca_cert`` (true with none)."""
        return all(ca_cert in _bundle(hook) for hook in self._webhooks())

    def _publish(self, bundle: bytes) -> None:
        stale = [hook["name"] for hook in self._webhooks() if _bundle(hook) != bundle]
        if not stale:
            return
        encoded = base64.b64encode(bundle).decode()
        patch: Json = {
            "webhooks": [{"name": name, "clientConfig": {"caBundle": encoded}} for name in stale]
        }
        self.api.patch(WEBHOOK_CONFIGS.path(self.place.webhook_config), patch, "strategic")
        log.info("caBundle of %s written", self.place.webhook_config)


def _bundle(hook: Json) -> bytes:
    try:
        return base64.b64decode(str((hook.get("clientConfig") or {}).get("caBundle") or ""))
    except ValueError:
        return b""


def _decoded(secret: Json) -> dict[str, bytes]:
    out = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            out[str(key)] = base64.b64decode(str(value))
        except ValueError:
            continue
    return out

"""A real Kubernetes control plane on loopback: etcd and kube-apiserver, with RBAC on.

The binaries come from ``hack/testenv`` (built from their Go modules into a cache outside
the repository). Certificates are generated per run: a CA, the API server's serving
certificate, an admin client certificate in ``system:masters``, and the service-account
signing key, so ServiceAccount tokens can be requested through the TokenRequest API.
With ``audit=True`` the API server also writes an audit log of every write
(tests/support/audit.py reads it), and :meth:`ControlPlane.client_kubeconfig` gives each
client a certificate of its own, so that log tells the clients apart.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from tests.support.audit import AUDIT_POLICY

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120


def testenv_bin() -> Path:
    """Build (when the cache is cold) and locate the control-plane binaries."""
    proc = subprocess.run(
        [str(REPO / "hack" / "testenv")], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"hack/testenv failed:\n{proc.stderr[-4000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Certificates:
    directory: Path
    ca_key: rsa.RSAPrivateKey = field(init=False)
    ca_cert: x509.Certificate = field(init=False)

    def __post_init__(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ca_key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuguard-test-ca")])
        self.ca_cert = (
            _builder(name, name, self.ca_key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.ca_key, hashes.SHA256())
        )
        self._write("ca.crt", self.ca_cert.public_bytes(serialization.Encoding.PEM))
        sa_key = _key()
        self._write("sa.key", _private_pem(sa_key))
        self._write(
            "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        )
        self.issue("apiserver", "kube-apiserver", server=True)
        self.issue("admin", "gpuguard-test-admin", organization="system:masters")

    def path(self, name: str) -> Path:
        return self.directory / name

    def issue(
        self, stem: str, common_name: str, *, organization: str | None = None, server: bool = False
    ) -> None:
        key = _key()
        attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        if organization:
            attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
        builder = _builder(x509.Name(attributes), self.ca_cert.subject, key)
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.DNSName("kubernetes.default.svc"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
                    ]
                ),
                critical=False,
            )
        cert = builder.sign(self.ca_key, hashes.SHA256())
        self._write(f"{stem}.crt", cert.public_bytes(serialization.Encoding.PEM))
        self._write(f"{stem}.key", _private_pem(key))

    def _write(self, name: str, data: bytes) -> None:
        self.path(name).write_bytes(data)


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _private_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def _builder(
    subject: x509.Name, issuer: x509.Name, key: rsa.RSAPrivateKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
    )


class Component:
    """A process (or several) the tests run: started on entering a ``with`` block, a failed
    start stopping what did start, and stopped on leaving it."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


class ControlPlane(Component):
    """etcd + kube-apiserver under a temporary directory; ``stop`` always cleans up.

    ``audit``: log every write (level Request, JSON lines) to ``audit_log``.
    ``service_accounts``: the ServiceAccount admission plugin on, so a kubelet mounts each
    pod's token (with :meth:`publish_root_ca` for the CA beside it); off by default, as
    the pods of the other tests have no kubelet and their accounts may not exist.
    ``extra_args``: more kube-apiserver flags (``--feature-gates``, ``--runtime-config``)."""

    def __init__(
        self,
        workdir: Path,
        bin_dir: Path,
        *,
        audit: bool = False,
        service_accounts: bool = False,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.workdir = workdir
        self.extra_args = extra_args
        self.audit_log = workdir / "audit.log" if audit else None
        self.service_accounts = service_accounts
        self.bin = bin_dir
        self.certs = Certificates(workdir / "pki")
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        self.admin_kubeconfig = workdir / "admin.kubeconfig"
        self.admin_kubeconfig.write_text(yaml.safe_dump(self.kubeconfig_for_admin()))

    # --- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        self._start_etcd()
        self.start_apiserver()

    def stop(self) -> None:
        self.stop_apiserver()
        terminate(self._etcd)
        self._etcd = None

    @property
    def apiserver_pid(self) -> int:
        """The running kube-apiserver's process id (for tests that freeze it)."""
        if self._apiserver is None:
            raise RuntimeError("kube-apiserver is not running")
        return self._apiserver.pid

    def start_apiserver(self) -> None:
        certs = self.certs
        log = (self.workdir / "kube-apiserver.log").open("ab")
        self._apiserver = subprocess.Popen(
            [
                str(self.bin / "kube-apiserver"),
                *self._audit_flags(),
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--tls-cert-file={certs.path('apiserver.crt')}",
                f"--tls-private-key-file={certs.path('apiserver.key')}",
                f"--client-ca-file={certs.path('ca.crt')}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={certs.path('sa.pub')}",
                f"--service-account-signing-key-file={certs.path('sa.key')}",
                "--api-audiences=https://kubernetes.default.svc",
                "--authorization-mode=RBAC",
                "--allow-privileged=true",  # as kubeadm, EKS, GKE and AKS run it
                "--service-cluster-ip-range=10.0.0.0/24",
                *([] if self.service_accounts else ["--disable-admission-plugins=ServiceAccount"]),
                "--enable-priority-and-fairness=false",
                "--v=1",
                *self.extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_ready()

    def stop_apiserver(self) -> None:
        terminate(self._apiserver)
        self._apiserver = None

    def _audit_flags(self) -> list[str]:
        if self.audit_log is None:
            return []
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        # The log backend's default mode, blocking: an answered write is already logged.
        return [
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
        ]

    def _start_etcd(self) -> None:
        log = (self.workdir / "etcd.log").open("ab")
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client = f"http://127.0.0.1:{self.etcd_port}"
        self._etcd = subprocess.Popen(
            [
                str(self.bin / "etcd"),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                "--unsafe-no-fsync",
                "--log-level=error",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        context = self.ssl_context()
        last_error = ""
        while time.monotonic() < deadline:
            if self._apiserver is not None and self._apiserver.poll() is not None:
                raise RuntimeError(
                    f"kube-apiserver exited; see {self.workdir / 'kube-apiserver.log'}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", context=context, timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError) as exc:
                last_error = str(exc)
            time.sleep(0.2)
        raise RuntimeError(f"kube-apiserver not ready after {START_TIMEOUT_S}s: {last_error}")

    # --- credentials -----------------------------------------------------------------
    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.certs.path("ca.crt")))
        context.load_cert_chain(self.certs.path("admin.crt"), self.certs.path("admin.key"))
        return context

    def kubeconfig_for_admin(self) -> dict[str, Any]:
        return self._kubeconfig_for_certificate("admin")

    def client_kubeconfig(self, user: str) -> Path:
        """A kubeconfig file for a client of its own: a certificate with ``user`` as its
        name (the audit log's user name), in ``system:masters``."""
        stem = f"client-{user}"
        self.certs.issue(stem, user, organization="system:masters")
        path = self.workdir / f"{stem}.kubeconfig"
        path.write_text(yaml.safe_dump(self._kubeconfig_for_certificate(stem)))
        return path

    def _kubeconfig_for_certificate(self, stem: str) -> dict[str, Any]:
        certs = self.certs
        return _kubeconfig(
            self.url,
            certs.path("ca.crt"),
            {
                "client-certificate-data": _b64(certs.path(f"{stem}.crt").read_bytes()),
                "client-key-data": _b64(certs.path(f"{stem}.key").read_bytes()),
            },
        )

    def kubeconfig_for_token(self, token: str) -> dict[str, Any]:
        return _kubeconfig(self.url, self.certs.path("ca.crt"), {"token": token})

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        """An admin API call (for test set-up); returns the decoded JSON answer.

        A transport failure (a connection reset or refused while a test restarts the API
        server) is retried on a new connection, twice: set-up is not what the tests assert
        on. A create retried after the server did act on the first try answers 409; the
        object is then read back.
        """
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(3):
            req = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
            req.add_header("Content-Type", content_type)
            try:
                with urllib.request.urlopen(req, context=self.ssl_context(), timeout=10) as answer:
                    return json.loads(answer.read() or b"null")
            except urllib.error.HTTPError as exc:
                name = (body or {}).get("metadata", {}).get("name") if method == "POST" else None
                if attempt and exc.code == 409 and name:
                    return self.request("GET", f"{path}/{name}")
                raise
            except (ssl.SSLError, ConnectionError, urllib.error.URLError):
                if attempt == 2:
                    raise
                time.sleep(0.5)
        raise AssertionError("unreachable")

    def publish_root_ca(self, namespace: str) -> None:
        """The ``kube-root-ca.crt`` ConfigMap that kube-controller-manager's root-CA
        publisher would write into ``namespace``: a pod's token volume mounts it."""
        self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/configmaps",
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "kube-root-ca.crt"},
                "data": {"ca.crt": self.certs.path("ca.crt").read_text()},
            },
        )

    def service_account_token(self, namespace: str, name: str, bound_pod: str | None = None) -> str:
        """A token for a ServiceAccount (bound to a Pod, and so to its node, if given)."""
        spec: dict[str, Any] = {
            "audiences": ["https://kubernetes.default.svc"],
            "expirationSeconds": 3600,
        }
        if bound_pod is not None:
            pod = self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{bound_pod}")
            spec["boundObjectRef"] = {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": bound_pod,
                "uid": pod["metadata"]["uid"],
            }
        answer = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        return str(answer["status"]["token"])


def _kubeconfig(server: str, ca: Path, user: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "test",
                "cluster": {"server": server, "certificate-authority-data": _b64(ca.read_bytes())},
            }
        ],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
        "current-context": "test",
    }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def terminate(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGTERM, then SIGKILL to its process group if it is still there after 15 s."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait(timeout=5)

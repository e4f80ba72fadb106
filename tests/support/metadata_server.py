"""A cloud metadata service on loopback: AWS (IMDSv2), GCE and Azure scheduled events.

Each provider's route demands that provider's header (AWS: a token from ``PUT
/latest/api/token``), as the real services do. ``answer`` sets the body the events path
serves next (``alternate`` cycles through several, one per request: an event that
comes and goes); ``delay_s`` holds each answer back (a slow service); the held-back answers
are released when the server stops.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from gpuguard.metrics_server import QuietHandler, QuietServer

AWS_TOKEN = "AQAEAFakeToken=="
EVENTS_PATHS = {
    "aws": "/latest/meta-data/events/maintenance/scheduled",
    "gcp": "/computeMetadata/v1/instance/maintenance-event",
    "azure": "/metadata/scheduledevents?api-version=2020-07-01",
}


@dataclass
class MetadataService:
    provider: str
    body: str = ""
    status: int = 200
    delay_s: float = 0.0
    url: str = ""
    alternate: list[str] = field(default_factory=list)
    acknowledged: list[object] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def answer(self, body: str, status: int = 200, delay_s: float = 0.0) -> None:
        self.body, self.status, self.delay_s, self.alternate = body, status, delay_s, []

    def next_body(self) -> str:
        if self.alternate:
            return self.alternate[len(self.requests) % len(self.alternate)]
        return self.body

    def allowed(self, method: str, path: str, headers: dict[str, str]) -> bool:
        if self.provider == "aws":
            return method == "GET" and headers.get("x-aws-ec2-metadata-token") == AWS_TOKEN
        if self.provider == "gcp":
            return headers.get("metadata-flavor") == "Google"
        return headers.get("metadata") == "true"


@contextmanager
def metadata_service(provider: str) -> Iterator[MetadataService]:
    service = MetadataService(provider)

    class Handler(QuietHandler):
        def do_PUT(self) -> None:
            ttl = self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
            if service.provider == "aws" and self.path == "/latest/api/token" and ttl:
                self._answer(200, AWS_TOKEN.encode())
            else:
                self._answer(400, b"bad request\n")

        def do_POST(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if service.provider != "azure" or self.path != EVENTS_PATHS["azure"]:
                self._answer(404, b"not found\n")
            elif not service.allowed("POST", self.path, headers):
                self._answer(401, b"unauthorized\n")
            else:
                service.acknowledged.append(json.loads(body))
                self._answer(200, b"")

        def do_GET(self) -> None:
            service.requests.append(self.path)
            headers = {k.lower(): v for k, v in self.headers.items()}
            if self.path != EVENTS_PATHS[service.provider]:
                self._answer(404, b"not found\n")
            elif not service.allowed("GET", self.path, headers):
                self._answer(401, b"unauthorized\n")
            else:
                service.stopping.wait(service.delay_s)
                with contextlib.suppress(ConnectionError):  # a client that gave up waiting
                    self._answer(service.status, service.next_body().encode())

    server = QuietServer(("127.0.0.1", 0), Handler)
    service.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield service
    finally:
        service.stopping.set()
        server.shutdown()
        server.server_close()

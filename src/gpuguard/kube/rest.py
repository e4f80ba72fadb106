"""A small raw-JSON client for the Kubernetes API: paths in, dicts out.

The controller lists every Node of a 5,000-node fleet; lightkube's models (or the official
client's) would double the parse time and hold the whole object graph (see "Kubernetes
conventions" in DESIGN.md). So this layer speaks plain JSON over lightkube's HTTP client,
reusing only lightkube's kubeconfig handling (TLS, tokens, exec plugins, ServiceAccount),
and lists page by page so a caller can shrink each item before the next page arrives.

Errors are split by what the caller does next: :class:`KubeUnavailable` (connection, 5xx,
429: retry later) and :class:`KubeRejected` (4xx: do not retry as is), with the statuses a
caller must tell apart as subclasses (:class:`KubeNotFound`, :class:`KubeConflict`, ...,
defined in :mod:`gpuguard.kube.api_errors` and importable from here).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import httpx2
import msgspec
from lightkube import KubeConfig
from lightkube.config.client_adapter import Client as http_client_for
from lightkube.config.client_adapter import ConnectionParams

from gpuguard.errors import ConfigError
from gpuguard.files import read_text_file
from gpuguard.kube.api_errors import (
    KubeConflict,
    KubeExpired,
    KubeNotFound,
    KubeRefused,
    KubeServerError,
    KubeStatusError,
    KubeThrottled,
    error_for,
    status_error,
)
from gpuguard.kube.errors import KubeFenced, KubeRejected, KubeUnavailable
from gpuguard.kube.inflight import InFlight

__all__ = [  # the errors are re-exported: callers import everything from here
    "LEASES",
    "NODES",
    "PODS",
    "Json",
    "KubeApi",
    "KubeConflict",
    "KubeExpired",
    "KubeNotFound",
    "KubeRefused",
    "KubeServerError",
    "KubeStatusError",
    "KubeThrottled",
    "Listing",
    "Resource",
    "WatchEvent",
    "load_api",
]

log = logging.getLogger(__name__)

# A decoded JSON object as the API server sends it: the one place JSON is untyped.
Json = dict[str, Any]
# A merge or strategic merge patch is an object; a JSON patch is a list of operations.
PatchBody = Json | list[Json]
PatchKind = Literal["merge", "strategic", "json"]
REQUEST_TIMEOUT_S = 10.0
LIST_PAGE_SIZE = 500
WATCH_TIMEOUT_S = 300
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_PATCH_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}


@dataclass(frozen=True)
class Resource:
    """Where a kind lives: ``/api/v1`` or ``/apis/<group>/<version>``, plus its plural."""

    prefix: str
    plural: str
    namespaced: bool = False

    def path(self, name: str = "", *, namespace: str = "", sub: str = "") -> str:
        """The URL path; a namespaced kind without ``namespace`` means all namespaces."""
        parts = [self.prefix]
        if self.namespaced and namespace:
            parts += ["namespaces", quote(namespace, safe="")]
        parts.append(self.plural)
        if name:
            parts.append(quote(name, safe=""))
        if sub:
            parts.append(sub)
        return "/".join(parts)


NODES = Resource("/api/v1", "nodes")
PODS = Resource("/api/v1", "pods", namespaced=True)
LEASES = Resource("/apis/coordination.k8s.io/v1", "leases", namespaced=True)


@dataclass(frozen=True)
class Listing:
    """The items of a (paged) list and the resourceVersion to watch from."""

    items: list[Json]
    resource_version: str


@dataclass(frozen=True)
class WatchEvent:
    """One line of a watch: ADDED, MODIFIED, DELETED or BOOKMARK, and the object."""

    type: str
    object: Json

    @property
    def resource_version(self) -> str:
        return str(self.object.get("metadata", {}).get("resourceVersion", ""))


class _WatchLine(msgspec.Struct):
    type: str = "None"
    object: msgspec.Raw = msgspec.Raw()


_WATCH_LINE = msgspec.json.Decoder(_WatchLine)


def watch_event(line: str, decode_object: Callable[[bytes], Json] | None = None) -> WatchEvent:
    """One line of a watch (an ``ERROR`` is raised), its object decoded by ``decode_object``
    straight into the shape the caller keeps, if given, not by ``json.loads``."""
    read = _WATCH_LINE.decode(line)
    kind, raw = read.type, bytes(read.object) or b"{}"
    obj = decode_object(raw) if decode_object and kind != "ERROR" else json.loads(raw)
    if kind == "ERROR":
        raise error_for(int(obj.get("code") or 500), obj)
    return WatchEvent(kind, obj)


def load_api_for_command(kubeconfig: Path | None) -> KubeApi:
    """``load_api`` for a command line, finding credentials as kubectl does: the flag,
    else the first file of ``$KUBECONFIG``, else ``~/.kube/config``, else the pod's service
    account. Credentials that cannot be loaded are a usage error naming where they were
    looked for, on one line, not a traceback."""
    flag = kubeconfig is not None
    kubeconfig = kubeconfig if flag else default_kubeconfig()
    where = "the pod's service account"
    if kubeconfig is not None:
        where = f"--kubeconfig {kubeconfig}" if flag else str(kubeconfig)
        read_text_file(kubeconfig, "kubeconfig")  # missing, binary, a directory: said plainly
    try:
        return load_api(kubeconfig)
    except KubeRejected as exc:
        raise ConfigError(f"{where}: {' '.join(str(exc).split())}") from None


def default_kubeconfig() -> Path | None:
    """The kubeconfig kubectl would read with no flag: the first existing file named in
    ``$KUBECONFIG``, else ``~/.kube/config``; None (in-cluster) when there is neither."""
    named = [Path(p) for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    home = Path.home() / ".kube" / "config"
    return next((p for p in [*named, home] if p.is_file()), None)


def load_api(
    kubeconfig: Path | None,
    *,
    timeout_s: float = REQUEST_TIMEOUT_S,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> KubeApi:
    """An API client from a kubeconfig file, or the pod's ServiceAccount when ``None``
    (token, CA and namespace under ``service_account_dir``, server from the environment;
    the token file is re-read when the API answers 401, as kubelet rotates it)."""
    try:
        if kubeconfig is None:
            config = KubeConfig.from_service_account(service_account_dir)
        else:
            config = KubeConfig.from_file(kubeconfig)
        single = config.get()
        if single is None:
            raise ValueError("the kubeconfig has no current context")
        http = http_client_for(single, ConnectionParams(timeout=httpx2.Timeout(timeout_s)))
    except Exception as exc:  # lightkube raises several types for a bad or absent config
        detail = f"no {exc} in it" if isinstance(exc, KeyError) else str(exc)
        raise KubeRejected(f"cannot load Kubernetes credentials: {detail}") from None
    return KubeApi(http)


class KubeApi:
    """get / list / watch / create / replace / patch / delete on API paths, as dicts.

    One client may be shared by many threads, and closed while some of them wait in a
    watch: they end with :class:`KubeUnavailable` (see :mod:`gpuguard.kube.inflight`)."""

    def __init__(self, http: httpx2.Client) -> None:
        self._http = http
        self._inflight = InFlight()
        self._fence: Callable[[], bool] | None = None
        self._fenced_what = ""

    def fenced(self, holds: Callable[[], bool], what: str) -> KubeApi:
        """The same connections, but every write first asks ``holds()`` and is not sent
        (:class:`KubeFenced`) when it says no: a controller's writes are fenced by its
        leadership, checked before each one, not only before a pass. Reads and watches
        are not fenced. Close the original client, not this view."""
        view = copy.copy(self)
        view._fence, view._fenced_what = holds, what
        return view

    def close(self) -> None:
        """End open watches, wait for requests in flight, then close the connections."""
        if self._inflight.close():
            self._http.close()
        else:
            # Closing under a reader would hand its descriptor to the next connection.
            log.warning("a Kubernetes request outlived close(); its connections stay open")

    def end_watches(self, stop: threading.Event) -> None:
        """End, at once, the watches started with ``stop`` (set it first); others go on."""
        self._inflight.end_streams(stop)

    def __enter__(self) -> KubeApi:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def get(self, path: str, params: Mapping[str, str] | None = None) -> Json:
        return self._call("GET", path, params=params)

    def create(self, path: str, body: Json, *, timeout_s: float | None = None) -> Json:
        """POST to a collection (or a subresource such as ``pods/x/eviction``)."""
        return self._call("POST", path, body=body, timeout_s=timeout_s)

    def replace(self, path: str, body: Json) -> Json:
        """PUT; a ``metadata.resourceVersion`` in ``body`` makes it conditional (409)."""
        return self._call("PUT", path, body=body)

    def patch(self, path: str, body: PatchBody, kind: PatchKind = "merge") -> Json:
        """PATCH; a merge patch carrying ``metadata.resourceVersion`` is conditional (409)."""
        return self._call("PATCH", path, body=body, content_type=_PATCH_TYPES[kind])

    def delete(self, path: str, body: Json | None = None) -> Json:
        """DELETE, with optional DeleteOptions (preconditions, grace period)."""
        return self._call("DELETE", path, body=body)

    def list(
        self,
        path: str,
        *,
        label_selector: str = "",
        field_selector: str = "",
        page_size: int = LIST_PAGE_SIZE,
        project: Callable[[Json], Json] | None = None,
        decode_page: Callable[[bytes], Json] | None = None,
    ) -> Listing:
        """Every item, ``page_size`` at a time; ``project`` shrinks each page's items.

        ``decode_page`` replaces ``json.loads`` for each page (it must return ``items`` and
        ``metadata``): a typed decoder that skips unread fields is far faster on Nodes."""
        params = _selectors(label_selector, field_selector)
        items: list[Json] = []
        token = ""
        restarted = False
        while True:
            page_params = {**params, "limit": str(page_size)} if page_size else dict(params)
            if token:
                page_params["continue"] = token
            try:
                page = self._call("GET", path, params=page_params, decode=decode_page)
            except KubeExpired:
                if restarted or not token:
                    raise
                # The continue token outlived etcd's compaction: one full list instead.
                items, token, restarted, page_size = [], "", True, 0
                continue
            found = page.get("items") or []
            if project is None:
                items.extend(found)
            else:
                items.extend(project(item) for item in found)
            metadata = page.get("metadata") or {}
            token = str(metadata.get("continue") or "")
            if not token:
                return Listing(items, str(metadata.get("resourceVersion", "")))

    def watch(
        self,
        path: str,
        *,
        resource_version: str,
        label_selector: str = "",
        field_selector: str = "",
        timeout_s: int = WATCH_TIMEOUT_S,
        stop: threading.Event | None = None,
        decode_object: Callable[[bytes], Json] | None = None,
    ) -> Iterator[WatchEvent]:
        """Stream changes after ``resource_version``, bookmarks included, until the server
        ends the watch (about ``timeout_s``). An ``ERROR`` line is raised as its status:
        :class:`KubeExpired` means the version is gone and the caller must list again.
        :meth:`end_watches` with ``stop`` ends it at once with :class:`KubeUnavailable`."""
        params = {
            **_selectors(label_selector, field_selector),
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_s),
        }
        timeout = httpx2.Timeout(REQUEST_TIMEOUT_S, read=timeout_s + REQUEST_TIMEOUT_S)
        what = f"watch {path}"
        try:
            with contextlib.ExitStack() as open_stream:
                with self._inflight.busy(what):
                    response = open_stream.enter_context(
                        self._http.stream("GET", path, params=params, timeout=timeout)
                    )
                open_stream.enter_context(self._inflight.stream(_socket_of(response), stop))
                if response.status_code >= 400:
                    with self._inflight.busy(what):
                        body = response.read()
                    raise status_error(response.status_code, body)
                lines = response.iter_lines()
                while True:
                    with self._inflight.busy(what):
                        line = next(lines, None)
                    if line is None:
                        return
                    if not line.strip():
                        continue
                    yield watch_event(line, decode_object)
        except (httpx2.HTTPError, OSError) as exc:
            raise KubeUnavailable(f"{what}: {type(exc).__name__}: {exc}") from None

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: PatchBody | None = None,
        content_type: str = "application/json",
        decode: Callable[[bytes], Json] | None = None,
        timeout_s: float | None = None,
    ) -> Json:
        content = None if body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if content is not None:
            headers["Content-Type"] = content_type
        try:
            with self._inflight.busy(f"{method} {path}"):
                # As late as the client allows: a write past this check when the
                # process froze goes out on thaw (state writes carry a resourceVersion).
                if method != "GET" and self._fence is not None and not self._fence():
                    raise KubeFenced(f"{method} {path} not sent: {self._fenced_what}")
                response = self._http.request(
                    method,
                    path,
                    params=params,
                    content=content,
                    headers=headers,
                    timeout=httpx2.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s,
                )
        except (httpx2.HTTPError, OSError) as exc:
            raise KubeUnavailable(f"{method} {path}: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 400:
            raise status_error(response.status_code, response.content)
        if decode is not None:
            return decode(response.content)
        answer = json.loads(response.content) if response.content else {}
        return answer if isinstance(answer, dict) else {"value": answer}


def _socket_of(response: httpx2.Response) -> object:
    """The socket under a streamed response (HTTP/1.1), or None."""
    stream = response.extensions.get("network_stream")
    return None if stream is None else stream.get_extra_info("socket")


def _selectors(label_selector: str, field_selector: str) -> dict[str, str]:
    params = {}
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    return params

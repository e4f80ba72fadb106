"""The raw-JSON REST layer against a real kube-apiserver: verbs, paging, watches, errors,
and the three ways of authenticating (client certificate, token, in-cluster files)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import httpx2
import pytest
import yaml

from gpuguard.kube.errors import KubeRejected, KubeUnavailable
from gpuguard.kube.rest import (
    NODES,
    KubeApi,
    KubeConflict,
    KubeNotFound,
    KubeRefused,
    Resource,
    WatchEvent,
    load_api,
)
from gpuguard.kube.watch import Snapshot, list_then_watch
from tests.support.cluster import wait_for
from tests.support.controlplane import ControlPlane, free_port

CONFIGMAPS = Resource("/api/v1", "configmaps", namespaced=True)
CRDS = Resource("/apis/apiextensions.k8s.io/v1", "customresourcedefinitions")


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[KubeApi]:
    with load_api(control_plane.admin_kubeconfig) as client:
        yield client


@pytest.fixture
def namespace(control_plane: ControlPlane) -> Iterator[str]:
    name = f"rest-{uuid.uuid4().hex[:8]}"
    control_plane.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    control_plane.request("DELETE", f"/api/v1/namespaces/{name}")


WATCH_MARKER = "watch-marker"


def configmap(name: str, **data: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def test_verbs_return_dicts_and_errors_are_split_by_status(api, namespace):
    collection = CONFIGMAPS.path(namespace=namespace)
    path = CONFIGMAPS.path("one", namespace=namespace)
    created = api.create(collection, configmap("one", a="1"))
    assert created["data"] == {"a": "1"}
    assert api.get(path)["metadata"]["uid"] == created["metadata"]["uid"]

    api.patch(path, {"data": {"b": "2"}})
    api.patch(path, {"data": {"c": "3"}}, "strategic")
    api.patch(path, [{"op": "remove", "path": "/data/a"}], "json")
    assert api.get(path)["data"] == {"b": "2", "c": "3"}

    stale = {**created, "data": {"stale": "yes"}}  # carries the first resourceVersion
    with pytest.raises(KubeConflict) as conflict:
        api.replace(path, stale)
    assert conflict.value.code == 409
    with pytest.raises(KubeConflict) as exists:
        api.create(collection, configmap("one"))
    assert exists.value.reason == "AlreadyExists"
    with pytest.raises(KubeNotFound):
        api.get(CONFIGMAPS.path("absent", namespace=namespace))
    with pytest.raises(KubeRefused) as invalid:
        api.create(collection, configmap("Not_A_Name"))
    assert invalid.value.code == 422
    assert isinstance(invalid.value, KubeRejected)

    api.delete(path)
    with pytest.raises(KubeNotFound):
        api.delete(path)


def test_list_pages_through_every_item_and_projects_each(control_plane, namespace):
    requests: list[httpx2.Request] = []
    api = load_api(control_plane.admin_kubeconfig)
    api._http.event_hooks = {"request": [requests.append]}
    for index in range(23):
        api.create(CONFIGMAPS.path(namespace=namespace), configmap(f"cm-{index:02d}", i=str(index)))

    listing = api.list(
        CONFIGMAPS.path(namespace=namespace),
        page_size=5,
        project=lambda item: {"name": item["metadata"]["name"]},
    )

    assert [item["name"] for item in listing.items] == [f"cm-{i:02d}" for i in range(23)]
    assert int(listing.resource_version) > 0
    pages = [r for r in requests if r.method == "GET"]
    assert len(pages) == 5
    assert all(r.url.params["limit"] == "5" for r in pages)
    api.close()


def test_list_then_watch_gives_snapshot_then_changes_without_bookmarks(api, namespace, monkeypatch):
    api.create(CONFIGMAPS.path(namespace=namespace), configmap("before"))
    stop = threading.Event()
    seen: list[Snapshot | WatchEvent] = []
    watches: list[str] = []  # the resourceVersion each watch request starts from
    watch = api.watch

    def counted(*args, **kwargs):
        watches.append(kwargs["resource_version"])
        return watch(*args, **kwargs)

    monkeypatch.setattr(api, "watch", counted)

    def follow() -> None:
        for change in list_then_watch(
            api, CONFIGMAPS.path(namespace=namespace), stop=stop, watch_timeout_s=1
        ):
            seen.append(change)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    wait_for(lambda: seen, 15, "the snapshot")
    collection = CONFIGMAPS.path(namespace=namespace)
    api.create(collection, configmap("after"))
    api.patch(CONFIGMAPS.path("after", namespace=namespace), {"data": {"x": "1"}})
    api.delete(CONFIGMAPS.path("before", namespace=namespace))
    advance_the_watch_cache(api, collection)
    # Past one watch timeout: the iterator re-watches from where it was.
    wait_for(lambda: len(watches) >= 2 and len(seen) == 4, 15, "a second watch request")
    api.create(collection, configmap("later"))
    wait_for(lambda: len(seen) == 5, 15, "four events")
    stop.set()
    api.close()  # ends the blocked read at once; the iterator returns quietly
    thread.join(5)
    assert not thread.is_alive()

    snapshot = seen[0]
    assert isinstance(snapshot, Snapshot)
    assert [item["metadata"]["name"] for item in snapshot.items] == ["before"]
    events = [(e.type, e.object["metadata"]["name"]) for e in seen[1:]]  # type: ignore[union-attr]
    assert events == [
        ("ADDED", "after"),
        ("MODIFIED", "after"),
        ("DELETED", "before"),
        ("ADDED", "later"),
    ]


def test_the_watch_does_not_hold_on_to_its_first_list(api, namespace):
    """The controller's cache replaces the listed objects as changes arrive: a snapshot
    the iterator kept for the watch's life would keep every replaced object (the soak's
    controller grew by its whole fleet this way)."""
    collection = CONFIGMAPS.path(namespace=namespace)
    api.create(collection, configmap("listed"))
    changes = list_then_watch(api, collection, watch_timeout_s=30)
    snapshot = next(changes)
    assert isinstance(snapshot, Snapshot) and snapshot.items
    listed = snapshot.items
    del snapshot
    api.create(collection, configmap("changed"))
    assert isinstance(next(changes), WatchEvent)
    assert changes.gi_frame is not None
    held = [v for v in changes.gi_frame.f_locals.values() if isinstance(v, Snapshot)]
    assert held == [] and sys.getrefcount(listed) == 2  # ours, and getrefcount's argument
    changes.close()


def test_raw_watch_delivers_bookmarks(api, namespace):
    collection = CONFIGMAPS.path(namespace=namespace)
    version = api.list(collection).resource_version

    advance_the_watch_cache(api, collection)  # the bookmarks' version is newer than this
    events = list(api.watch(collection, resource_version=version, timeout_s=4))
    assert events
    assert {event.type for event in events} == {"BOOKMARK"}  # one or two, by timing
    assert int(events[-1].resource_version) > int(version)


def test_watch_from_a_version_the_cache_no_longer_has_relists(api):
    # A new kind's watch cache starts at the version it was created at: anything older is
    # 410 Gone, exactly what a watch sees after etcd's compaction window has passed.
    group = f"g{uuid.uuid4().hex[:6]}.test.gpuguard.io"
    api.create(
        CRDS.path(),
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"widgets.{group}"},
            "spec": {
                "group": group,
                "scope": "Cluster",
                "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {"openAPIV3Schema": {"type": "object"}},
                    }
                ],
            },
        },
    )
    widgets = Resource(f"/apis/{group}/v1", "widgets")
    widget = {"apiVersion": f"{group}/v1", "kind": "Widget", "metadata": {"name": "w"}}
    wait_for(lambda: try_create(api, widgets.path(), widget), 15, "the new kind to be served")

    changes = list_then_watch(api, widgets.path(), resource_version="1", watch_timeout_s=2)
    first = next(changes)
    changes.close()

    assert isinstance(first, Snapshot)
    assert [item["metadata"]["name"] for item in first.items] == ["w"]
    api.delete(CRDS.path(f"widgets.{group}"))


def test_a_closed_port_is_unavailable_not_rejected(control_plane, tmp_path):
    config = control_plane.kubeconfig_for_admin()
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(KubeUnavailable), load_api(path, timeout_s=2) as api:
        api.get(NODES.path())


def test_bad_credentials_file_is_rejected(tmp_path):
    with pytest.raises(KubeRejected, match="credentials"):
        load_api(tmp_path / "missing")


def test_in_cluster_service_account_files_and_rbac(control_plane, namespace, tmp_path, monkeypatch):
    control_plane.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"metadata": {"name": "reader"}},
    )
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "token").write_text(control_plane.service_account_token(namespace, "reader"))
    (account / "namespace").write_text(namespace)
    (account / "ca.crt").write_bytes(control_plane.certs.path("ca.crt").read_bytes())
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(control_plane.port))

    with load_api(None, service_account_dir=account) as api:
        with pytest.raises(KubeRefused) as forbidden:
            api.list(NODES.path())
        assert forbidden.value.code == 403
        # Every authenticated account may ask who it is.
        review = api.create(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        )
    assert review["status"]["userInfo"]["username"] == (f"system:serviceaccount:{namespace}:reader")


def advance_the_watch_cache(api: KubeApi, collection: str) -> None:
    """Bookmarks carry a version newer than the watcher's: a write elsewhere, then a
    consistent read of the watched kind (which makes its cache catch up with etcd)."""
    name = f"bookmark-{uuid.uuid4().hex[:6]}"
    api.create(NODES.path(), {"metadata": {"name": name}})
    api.delete(NODES.path(name))
    api.list(collection)


def try_create(api: KubeApi, path: str, body: dict[str, object]) -> bool:
    try:
        api.create(path, body)
    except (KubeNotFound, KubeUnavailable):
        return False
    return True


# --- ending watches that other threads are blocked in -----------------------------------
def start_watch(api: KubeApi, namespace: str, stop: threading.Event | None = None):
    seen: list[str | None] = []
    outcome: dict[str, object] = {"seen": seen}

    def follow() -> None:
        try:
            for event in api.watch(
                CONFIGMAPS.path(namespace=namespace),
                resource_version="0",
                timeout_s=120,
                stop=stop,
            ):
                seen.append(event.object["metadata"].get("name"))  # None for a bookmark
        except KubeUnavailable as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread, outcome


def blocked_watch(api: KubeApi, namespace: str, stop: threading.Event | None = None):
    """A thread blocked in a watch of the ConfigMaps in ``namespace``, and what it ended
    with: the names of the objects it saw and the error that ended it. It is reading once
    it has seen the namespace's marker ConfigMap (a watch from version 0 starts with it)."""
    with contextlib.suppress(KubeConflict):
        api.create(CONFIGMAPS.path(namespace=namespace), configmap(WATCH_MARKER))
    thread, outcome = start_watch(api, namespace, stop)
    wait_for(lambda: WATCH_MARKER in outcome["seen"], 5, "the watch reading")
    assert thread.is_alive()
    return thread, outcome


def test_close_ends_blocked_watches_before_freeing_their_sockets(control_plane, namespace):
    # A closed client used to free the descriptors of connections whose watches were still
    # blocked reading; the next client got the same numbers and the orphaned readers ate
    # its TLS records ("bad record mac" in an unrelated request). Now close() wakes them
    # first and the next client's requests all succeed.
    for _ in range(5):
        old = load_api(control_plane.admin_kubeconfig)
        watchers = [blocked_watch(old, namespace) for _ in range(3)]
        started = time.monotonic()
        old.close()
        for thread, outcome in watchers:
            thread.join(3)
            assert not thread.is_alive(), "a watch outlived close() by 3 s"
            assert isinstance(outcome["error"], KubeUnavailable)
        assert time.monotonic() - started < 3
        with load_api(control_plane.admin_kubeconfig) as new:
            for i in range(20):
                name = f"after-close-{i}"
                new.create(CONFIGMAPS.path(namespace=namespace), configmap(name))
                new.delete(CONFIGMAPS.path(name, namespace=namespace))
    with pytest.raises(KubeUnavailable, match="client is closed"):
        old.get(NODES.path())


def test_end_watches_ends_only_the_watches_of_that_stop_event(api, namespace):
    mine, others = threading.Event(), threading.Event()
    stopped_thread, stopped = blocked_watch(api, namespace, mine)
    going_thread, going = blocked_watch(api, namespace, others)

    mine.set()
    api.end_watches(mine)
    stopped_thread.join(2)
    assert not stopped_thread.is_alive()
    assert isinstance(stopped["error"], KubeUnavailable)

    # The other watch still reads: a change in the namespace reaches it. (Other ConfigMaps
    # may show up too: kube-controller-manager publishes kube-root-ca.crt in every namespace.)
    api.create(CONFIGMAPS.path(namespace=namespace), configmap("seen"))
    wait_for(lambda: "seen" in going["seen"], 5, "the change, on the other watch")
    assert going_thread.is_alive()

    # A watch started after its stop event was ended ends at once, not after its timeout.
    late_thread, late = start_watch(api, namespace, mine)
    late_thread.join(2)
    assert not late_thread.is_alive()
    assert isinstance(late["error"], KubeUnavailable)
    others.set()
    api.end_watches(others)
    going_thread.join(2)
    assert not going_thread.is_alive()

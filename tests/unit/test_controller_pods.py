"""The pod cache the controller keeps from its pod watch."""

from __future__ import annotations

from gpuguard.controller.pods import PodCache, slim_pod
from gpuguard.kube.rest import WatchEvent
from gpuguard.kube.watch import Snapshot

GPU = "0000:1b:00.0"


def pod(name: str, node: str, *, gpus: int = 1, owner: str = "Job", **extra: object) -> dict:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    body = {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "ownerReferences": [{"kind": owner, "name": "x", "uid": "o"}],
            "annotations": {"gpuguard.io/gpu-ids": GPU, "unrelated": "dropped"},
            "managedFields": [{"manager": "kubelet"}],
        },
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready"}]},
    }
    body["metadata"].update(extra)
    return body


def event(kind: str, obj: dict) -> WatchEvent:
    return WatchEvent(kind, slim_pod(obj))


def test_the_slim_pod_keeps_what_the_drain_rules_read_and_nothing_else():
    slim = slim_pod(pod("a", "n1", deletionTimestamp="2026-12-01T00:00:00Z"))
    assert slim["metadata"]["annotations"] == {"gpuguard.io/gpu-ids": GPU}
    assert "managedFields" not in slim["metadata"] and "conditions" not in slim["status"]
    assert slim["metadata"]["deletionTimestamp"] and slim["metadata"]["ownerReferences"]


def test_counts_follow_the_watch():
    cache = PodCache()
    listed = Snapshot([slim_pod(p) for p in (pod("a", "n1"), pod("b", "n2"))], "1")
    assert cache.take(listed) == {"n1", "n2"}
    assert (cache.to_move("n1"), cache.on_gpus("n1", [GPU]), cache.to_move("n3")) == (1, 1, 0)
    daemon = pod("d", "n1", owner="DaemonSet")
    assert cache.take(event("ADDED", daemon)) == {"n1"}
    assert cache.to_move("n1") == 1  # a DaemonSet pod is never moved
    leaving = pod("a", "n1", deletionTimestamp="2026-12-01T00:00:00Z")
    # Terminating still holds the GPU: no count changes, nothing to look at again.
    assert cache.take(event("MODIFIED", leaving)) == set()
    assert cache.to_move("n1") == 1
    assert cache.take(event("DELETED", leaving)) == {"n1"}
    assert cache.to_move("n1") == cache.on_gpus("n1", [GPU]) == 0
    # A pod rescheduled elsewhere under the same uid leaves its old node.
    assert cache.take(event("MODIFIED", pod("b", "n3"))) == {"n2", "n3"}
    assert (cache.to_move("n2"), cache.to_move("n3")) == (0, 1)
    assert cache.take(event("ADDED", pod("p", ""))) == set()  # not scheduled yet
    finished = pod("b", "n3")
    finished["status"]["phase"] = "Succeeded"
    assert cache.take(event("MODIFIED", finished)) == {"n3"} and cache.to_move("n3") == 0


def protected(value: str, started: str | None = "2026-12-01T00:00:00Z", **extra: object) -> dict:
    body = pod("t", "n1", **extra)
    body["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] = value
    if started is not None:
        body["status"]["startTime"] = started
    return body


START = 1_796_083_200.0  # 2026-12-01T00:00:00Z


def test_do_not_disrupt_holds_as_karpenter_reads_it():
    cache = PodCache()
    assert cache.take(event("ADDED", protected("true"))) == {"n1"}
    assert cache.protected_by("n1", START + 10**6) == "ml/t"  # "true": while it runs
    assert cache.protected_by("n2", START) == ""
    # A Go duration protects until the pod has run that long.
    cache.take(event("MODIFIED", protected("1h30m")))
    assert cache.protected_by("n1", START + 5399) == "ml/t"
    assert cache.protected_by("n1", START + 5400) == ""
    cache.take(event("MODIFIED", protected("90m", started=None)))
    assert cache.protected_by("n1", START + 10**6) == "ml/t"  # not started: fail safe
    for ignored in ("false", "yes", "-5m", "0s", "5", "5 m", "1h-3m", ""):
        cache.take(event("MODIFIED", protected(ignored)))
        assert cache.protected_by("n1", START) == "", ignored
    # A finished or terminating pod protects nothing.
    cache.take(event("MODIFIED", protected("true", deletionTimestamp="2026-12-01T01:00:00Z")))
    assert cache.protected_by("n1", START) == ""
    done = protected("true")
    done["status"]["phase"] = "Succeeded"
    cache.take(event("MODIFIED", done))
    assert cache.protected_by("n1", START) == ""


def test_a_pod_gaining_do_not_disrupt_wakes_its_node():
    cache = PodCache()
    cache.take(event("ADDED", pod("t", "n1")))
    assert cache.take(event("MODIFIED", protected("true"))) == {"n1"}
    assert cache.take(event("MODIFIED", protected("true"))) == set()


def test_a_pod_holding_resource_claims_counts_as_on_the_gpus():
    """Which devices a DRA claim was given is not on the pod: a reset waits for it all
    the same, as for a device-plugin pod whose GPUs are not named."""
    claimed = pod("c", "n1", gpus=0, annotations={})
    claimed["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "claim-7"}]
    plain = pod("p", "n1", gpus=0, annotations={})
    slim = slim_pod(claimed)
    assert slim["spec"]["resourceClaims"] == [{"name": "gpus"}]
    assert "resourceClaims" not in slim_pod(plain)["spec"]  # nothing kept for most pods
    cache = PodCache()
    cache.take(Snapshot([slim, slim_pod(plain)], "1"))
    assert cache.on_gpus("n1", [GPU]) == 1
    assert [p["metadata"]["name"] for p in cache.running_on("n1", [GPU])] == ["c"]

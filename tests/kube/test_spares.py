"""Warm spares (the chart's ``spares:``, templates/spares.yaml): placeholder pods of a
negative priority keep a node per spare up in a Karpenter NodePool. The chart as rendered
and refused by ``helm template``, then on the real control plane with the real Karpenter
(``karpenter_plane``): a training pod whose node gpuguard quarantined preempts a
placeholder and runs on its node at once, and Karpenter launches a node for the evicted
placeholder, refilling the pool.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuguard.kube import drain, fleet
from gpuguard.kube.rest import KubeApi, KubeNotFound, load_api
from tests.support.cluster import wait_for
from tests.support.controlplane import REPO, ControlPlane
from tests.support.jobsystem import create_job, job_pods, running_pod, training_job
from tests.support.karpenter import TRAIN_NAMESPACE, gpu_nodepool

CHART = REPO / "deploy" / "helm" / "gpuguard"
RELEASE = NAMESPACE = "gpuguard"  # the namespace karpenter_plane creates for gpuguard
SPARE_POOL = "warm"  # a NodePool of this module's own: other tests' nodes stay out of it
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
# What examples/jobs/job.yaml tolerates: the GPU nodes' own taint only.
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
NODEPOOL_LABEL = "karpenter.sh/nodepool"
LAUNCH_TIMEOUT_S = 120  # a NodeClaim launched, registered and Ready, the pod started


def spare_pool(nodes: int = 1, **overrides: Any) -> dict[str, Any]:
    pool = {
        "nodePool": SPARE_POOL,
        "nodes": nodes,
        "resources": {"nvidia.com/gpu": 8},
        "tolerations": [GPU_TOLERATION],
    }
    return pool | overrides


def render(
    helm: Callable[..., str], tmp_path: Path, spares: dict[str, Any], *flags: str
) -> list[dict[str, Any]]:
    """The chart's objects with ``spares`` merged into its values."""
    values = tmp_path / "spares-values.yaml"
    values.write_text(yaml.safe_dump({"spares": spares}))
    out = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(values), *flags)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def refusal(helm: Callable[..., str], tmp_path: Path, spares: dict[str, Any]) -> str:
    values = tmp_path / "spares-values.yaml"
    values.write_text(yaml.safe_dump({"spares": spares}))
    return helm("template", RELEASE, str(CHART), "-f", str(values), ok=False)


def spare_objects(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        o
        for o in objects
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "spare"
    ]


# --- the chart ---------------------------------------------------------------------------


def test_spares_are_off_by_default(helm, tmp_path):
    objects = render(helm, tmp_path, {})
    assert not spare_objects(objects)
    assert not [o for o in objects if o["kind"] == "PriorityClass"]


def test_each_pool_gets_placeholders_that_hold_a_whole_node_each_below_every_training_pod(
    helm, tmp_path
):
    other = spare_pool(2, nodePool="gpu-b", resources={"nvidia.com/gpu": 4, "cpu": "90"})
    objects = spare_objects(
        render(helm, tmp_path, {"enabled": True, "pools": [spare_pool(), other]})
    )
    (priority,) = [o for o in objects if o["kind"] == "PriorityClass"]
    assert priority["value"] < 0  # pods without a class (0) preempt the placeholders
    assert priority["preemptionPolicy"] == "Never"  # and placeholders preempt nothing
    assert priority["globalDefault"] is False
    deployments = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    assert set(deployments) == {"gpuguard-spare-warm", "gpuguard-spare-gpu-b"}
    for pool in (spare_pool(), other):
        deployment = deployments[f"gpuguard-spare-{pool['nodePool']}"]
        assert deployment["metadata"]["namespace"] == NAMESPACE
        assert deployment["spec"]["replicas"] == pool["nodes"]
        template = deployment["spec"]["template"]
        spec = template["spec"]
        assert spec["priorityClassName"] == priority["metadata"]["name"]
        assert spec["nodeSelector"] == {NODEPOOL_LABEL: pool["nodePool"]}
        assert spec["tolerations"] == [GPU_TOLERATION]
        (container,) = spec["containers"]
        assert container["image"].startswith("registry.k8s.io/pause:")
        assert container["resources"] == {
            "requests": pool["resources"],
            "limits": pool["resources"],
        }
        # One placeholder a node, and only this pool's placeholders keep each other apart.
        (term,) = spec["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"] == template["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"] == template["metadata"]["labels"]
        # Not the agent's pods: its DaemonSet and metrics Service select on the name.
        assert template["metadata"]["labels"]["app.kubernetes.io/name"] != "gpuguard"


@pytest.mark.parametrize(
    ("pool", "complaint"),
    [
        (spare_pool(nodes=-1), "'/spares/pools/0/nodes': minimum: got -1, want 0"),
        (
            spare_pool(tolerations=[{"key": "gpuguard.io/unhealthy", "operator": "Exists"}]),
            "'/spares/pools/0/tolerations/0/key': 'not' failed",
        ),
        (
            spare_pool(tolerations=[{"operator": "Exists"}]),
            "'/spares/pools/0/tolerations/0': missing property 'key'",
        ),
        (spare_pool(resources={}), "'/spares/pools/0/resources': minProperties"),
        (spare_pool(nodePool="GPU pool"), "'/spares/pools/0/nodePool'"),
        ({"nodepool": SPARE_POOL, "nodes": 1, "resources": {"cpu": "1"}}, "'nodepool' not allowed"),
    ],
)
def test_the_schema_refuses_a_pool_that_would_not_do_what_it_says(helm, tmp_path, pool, complaint):
    assert complaint in refusal(helm, tmp_path, {"enabled": True, "pools": [pool]})


def test_a_priority_that_training_pods_would_not_outrank_is_refused(helm, tmp_path):
    err = refusal(helm, tmp_path, {"enabled": True, "priority": 0, "pools": [spare_pool()]})
    assert "'/spares/priority': maximum: got 0, want -1" in err


def test_the_template_names_its_refusals(helm, tmp_path):
    assert "spares.pools is empty" in refusal(helm, tmp_path, {"enabled": True})
    twice = {"enabled": True, "pools": [spare_pool(), spare_pool(2)]}
    assert f'nodePool "{SPARE_POOL}" is listed twice' in refusal(helm, tmp_path, twice)
    # Past the schema (--skip-schema-validation), the template still refuses to let a
    # placeholder tolerate the quarantine, and says why.
    values = tmp_path / "spares-values.yaml"
    tolerate_all = spare_pool(tolerations=[{"operator": "Exists"}])
    values.write_text(yaml.safe_dump({"spares": {"enabled": True, "pools": [tolerate_all]}}))
    err = helm(
        "template", RELEASE, str(CHART), "--skip-schema-validation", "-f", str(values), ok=False
    )
    assert "would hold a quarantined node" in err


# --- on the real Karpenter -----------------------------------------------------------------


def warm_nodepool() -> dict[str, Any]:
    """Like the shared plane's GPU NodePool, tainted as GPU nodes commonly are."""
    pool = copy.deepcopy(gpu_nodepool())
    pool["metadata"]["name"] = SPARE_POOL
    pool["spec"]["template"]["spec"]["taints"] = [GPU_TAINT]
    return pool


def apply(api: KubeApi, objects: list[dict[str, Any]]) -> None:
    """Create the rendered PriorityClass and Deployments."""
    collections = {
        "PriorityClass": "/apis/scheduling.k8s.io/v1/priorityclasses",
        "Deployment": f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments",
    }
    for item in objects:
        api.create(collections[item["kind"]], item)


def delete(api: KubeApi, objects: list[dict[str, Any]]) -> None:
    """Delete the rendered objects, and the ReplicaSets and pods of the Deployments by
    hand: no garbage collector runs on this plane."""
    paths = {
        "PriorityClass": "/apis/scheduling.k8s.io/v1/priorityclasses/{name}",
        "Deployment": f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{{name}}",
    }
    for item in objects:
        api.delete(paths[item["kind"]].format(name=item["metadata"]["name"]))
    selector = f"gpuguard.io/spare-pool={SPARE_POOL}"
    for collection in (
        f"/apis/apps/v1/namespaces/{NAMESPACE}/replicasets",
        f"/api/v1/namespaces/{NAMESPACE}/pods",
    ):
        for owned in api.list(collection, label_selector=selector).items:
            with contextlib.suppress(KubeNotFound):
                api.delete(f"{collection}/{owned['metadata']['name']}")


@pytest.fixture
def warm_pool(
    karpenter_plane: ControlPlane, helm: Callable[..., str], tmp_path: Path
) -> Iterator[KubeApi]:
    """The NodePool ``warm`` with the chart's spares for it (one node) applied; afterwards
    the placeholders, the NodePool and so its nodes go (Karpenter removes them)."""
    api = load_api(karpenter_plane.admin_kubeconfig)
    objects = spare_objects(render(helm, tmp_path, {"enabled": True, "pools": [spare_pool(1)]}))
    api.create("/apis/karpenter.sh/v1/nodepools", warm_nodepool())
    apply(api, objects)
    try:
        yield api
    finally:
        delete(api, objects)
        api.delete(f"/apis/karpenter.sh/v1/nodepools/{SPARE_POOL}")
        api.close()


def pool_nodes(api: KubeApi) -> set[str]:
    nodes = api.list("/api/v1/nodes", label_selector=f"{NODEPOOL_LABEL}={SPARE_POOL}").items
    return {n["metadata"]["name"] for n in nodes}


def placeholder_nodes(api: KubeApi) -> list[str]:
    """The nodes of the running placeholders (one entry each)."""
    pods = api.list(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        label_selector=f"gpuguard.io/spare-pool={SPARE_POOL}",
    ).items
    return sorted(
        p["spec"]["nodeName"]
        for p in pods
        if (p.get("status") or {}).get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
    )


def other_pods(api: KubeApi, job: str, *, not_uid: str) -> list[dict[str, Any]]:
    pods = job_pods(api, TRAIN_NAMESPACE, job)
    return [p for p in pods if p["metadata"]["uid"] != not_uid]


def test_a_quarantined_nodes_pod_preempts_a_spare_and_karpenter_refills_the_pool(
    warm_pool: KubeApi,
) -> None:
    """One spare in the pool: the training pod whose node gpuguard quarantined (its taint,
    then its eviction, gpuguard's own calls) runs on the spare node with no node launched
    first, and Karpenter launches a node for the evicted placeholder.

    Measured here (KWOK as kubelet, 2 shared cores, three runs): the Job's new pod is
    created 9.4-9.6 s after the eviction (the Job controller's back-off after a failed pod,
    10 s, spares or not) and runs on the spare at most 0.1 s later (preemption, bind,
    start); the pool is refilled, the evicted placeholder running on a node Karpenter
    launched, at 10.6-11.0 s, 1.2-1.3 s after the preemption (KWOK's machines start at
    once; a real GPU machine takes minutes, which the replacement pod would otherwise wait).
    """
    api = warm_pool
    wait_for(lambda: len(placeholder_nodes(api)) == 1, LAUNCH_TIMEOUT_S, "the spare node up")
    job = training_job()
    job["spec"]["template"]["spec"]["nodeSelector"] = {NODEPOOL_LABEL: SPARE_POOL}
    name = create_job(api, TRAIN_NAMESPACE, job)
    try:
        first = wait_for(
            lambda: running_pod(api, TRAIN_NAMESPACE, name), LAUNCH_TIMEOUT_S, "the job running"
        )
        sick = first["spec"]["nodeName"]
        # The job took the spare or a node of its own; either way the pool is refilled.
        (spare,) = wait_for(
            lambda: [n for n in placeholder_nodes(api) if n != sick] or None,
            LAUNCH_TIMEOUT_S,
            "a spare beside the job's node",
        )
        before = pool_nodes(api)

        fleet.taint(api, api.get(f"/api/v1/nodes/{sick}"))
        evicted_at = time.monotonic()
        assert drain.evict(api, first) is drain.EvictionOutcome.EVICTED
        uid = first["metadata"]["uid"]
        # Two figures: the Job controller's part (its replacement pod created) and the
        # spare's (that pod preempting the placeholder and running on its node).
        wait_for(lambda: other_pods(api, name, not_uid=uid), 60, "the job's new pod created")
        created_s = time.monotonic() - evicted_at
        replacement = wait_for(
            lambda: running_pod(api, TRAIN_NAMESPACE, name, not_uid=uid),
            LAUNCH_TIMEOUT_S,
            "the job's new pod running",
        )
        rescheduled_s = time.monotonic() - evicted_at
        assert replacement["spec"]["nodeName"] == spare
        assert spare in before  # a node that was up before the eviction, not a new one

        (refill,) = wait_for(
            lambda: placeholder_nodes(api) or None, LAUNCH_TIMEOUT_S, "the pool refilled"
        )
        refilled_s = time.monotonic() - evicted_at
        assert refill not in before  # Karpenter launched it for the evicted placeholder
        assert NODEPOOL_LABEL in api.get(f"/api/v1/nodes/{refill}")["metadata"]["labels"]
        print(
            f"spare: new pod created {created_s:.2f} s after the eviction, running on the"
            f" spare at {rescheduled_s:.2f} s; pool refilled at {refilled_s:.2f} s"
        )
    finally:
        # Its pod goes with the NodePool's nodes (the pod garbage collector runs here).
        api.delete(f"/apis/batch/v1/namespaces/{TRAIN_NAMESPACE}/jobs/{name}")

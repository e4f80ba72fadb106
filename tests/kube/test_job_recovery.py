"""Jobs survive gpuguard's repairs, end to end: the real Job controller, scheduler and
gpuguard controller, with KWOK as the kubelet (tests/support/jobsystem.py).

The Job is examples/jobs/job.yaml itself (its podFailurePolicy untouched), made to fit the
test cluster: no checkpoint volume, pinned to the test's nodes, and backoffLimit 0 so that
a single failure charged to the job fails it for all to see. The example manifests are
also checked against the API server's schemas, the JobSet and PyTorchJob ones through
their CRDs as released.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuguard.cli import build_parser
from gpuguard.contract.keys import TAINT_KEY
from gpuguard.controller.loop import Controller
from gpuguard.kube.rest import Json, KubeApi, KubeRejected
from tests.support.cluster import install_crd, set_health, wait_for
from tests.support.controllers import Running, new_controller
from tests.support.jobsystem import (
    end_pod,
    example,
    finished_as,
    job_status,
    released_crd,
    resumed,
    start_on_sick_node,
    training_job,
)
from tests.support.metrics import sample

ACTIONS, EVICTIONS = "gpuguard_controller_actions_total", "gpuguard_controller_evictions_total"


@pytest.fixture
def start_gpuguard(api: KubeApi, jobs: str) -> Iterator[Callable[[], Controller]]:
    running: list[Running] = []

    def start() -> Controller:
        # A long action timeout: nothing answers the reboot request, and the episode
        # should stay put (drained, cordoned) while the test watches the Job.
        controller = new_controller(api, jobs, action_timeout_s=600)
        running.append(Running(controller.run))
        return controller

    yield start
    for item in running:
        item.halt()


# --- end to end ------------------------------------------------------------------------
def test_a_drained_job_resumes_on_a_healthy_node_without_a_counted_failure(
    api, jobs, start_gpuguard
):
    name, first, healthy = start_on_sick_node(api, jobs, training_job())
    controller = start_gpuguard()
    set_health(api, first["spec"]["nodeName"], gpu="False", action="REBOOT", codes=("XID_79",))

    second = resumed(api, jobs, name, first)
    assert second["spec"]["nodeName"] == healthy
    assert sample(controller.metrics.registry, EVICTIONS, outcome="evicted") >= 1
    assert not job_status(api, jobs, name).get("failed")

    end_pod(api, second, 0)
    assert wait_for(lambda: finished_as(api, jobs, name), 30, "the job finished") == (
        "Complete",
        "CompletionsReached",
    )
    status = job_status(api, jobs, name)
    assert status["succeeded"] == 1 and not status.get("failed")


def test_a_job_whose_pod_gpuguard_kills_is_not_charged(api, jobs, start_gpuguard):
    name, first, healthy = start_on_sick_node(api, jobs, training_job())
    sick = first["spec"]["nodeName"]
    controller = start_gpuguard()
    set_health(api, sick, gpu="False", action="KILL_JOB", codes=("XID_13",))

    second = resumed(api, jobs, name, first)
    assert second["spec"]["nodeName"] == healthy
    assert sample(controller.metrics.registry, ACTIONS, kind="KillPods", result="ok") >= 1
    assert (
        sample(controller.metrics.registry, EVICTIONS, outcome="evicted") == 0
    )  # killed, not evicted
    assert not job_status(api, jobs, name).get("failed")
    set_health(api, sick)  # the job's fault went with its pod

    end_pod(api, second, 0)
    assert wait_for(lambda: finished_as(api, jobs, name), 30, "the job finished")[0] == "Complete"
    assert not job_status(api, jobs, name).get("failed")


def test_without_the_failure_policy_the_same_drain_fails_the_job(api, jobs, start_gpuguard):
    job = training_job(failure_policy=False)
    name, first, _ = start_on_sick_node(api, jobs, job)
    start_gpuguard()
    set_health(api, first["spec"]["nodeName"], gpu="False", action="REBOOT", codes=("XID_79",))

    assert wait_for(lambda: finished_as(api, jobs, name), 60, "the job failed") == (
        "Failed",
        "BackoffLimitExceeded",
    )
    assert job_status(api, jobs, name)["failed"] == 1


def test_a_kill_without_disruption_target_is_charged_despite_the_policy(api, jobs):
    """What kill_pods' DisruptionTarget condition is for: the same delete without it
    leaves the Job controller nothing to tell a repair from a crash."""
    name, first, _ = start_on_sick_node(api, jobs, training_job())
    meta = first["metadata"]
    api.delete(
        f"/api/v1/namespaces/{jobs}/pods/{meta['name']}", {"preconditions": {"uid": meta["uid"]}}
    )

    assert wait_for(lambda: finished_as(api, jobs, name), 30, "the job failed") == (
        "Failed",
        "BackoffLimitExceeded",
    )


def test_the_examples_exit_codes_preempted_is_ignored_and_an_application_error_fails(api, jobs):
    name, first, _ = start_on_sick_node(api, jobs, training_job())
    end_pod(api, first, 75)  # gpuguard run: "preempted, resume me"
    second = resumed(api, jobs, name, first)
    assert not job_status(api, jobs, name).get("failed")

    end_pod(api, second, 1)  # the script's error, after gpuguard run's own retries
    assert wait_for(lambda: finished_as(api, jobs, name), 30, "the job failed") == (
        "Failed",
        "PodFailurePolicy",
    )


# --- the example manifests against the API server's schemas -----------------------------
CRDS = ("jobset.x-k8s.io_jobsets.yaml", "kubeflow.org_pytorchjobs.yaml")
CREATE_PATHS = {
    "job.yaml": "/apis/batch/v1/namespaces/default/jobs",
    "jobset.yaml": "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets",
    "pytorchjob.yaml": "/apis/kubeflow.org/v1/namespaces/default/pytorchjobs",
}
# Strict: a field the schema lacks is an error, not silently pruned.
DRY_RUN = "?dryRun=All&fieldValidation=Strict"
# Time to finish a step and write a large model's checkpoint to shared storage.
LEAST_GRACE_S = 120


@pytest.fixture(scope="module")
def workload_crds(api: KubeApi) -> None:
    """JobSet's and Kubeflow's CRDs as released (hack/testenv fetches them)."""
    for name in CRDS:
        install_crd(api, released_crd(name))


@pytest.mark.parametrize("manifest", sorted(CREATE_PATHS))
def test_example_manifest_is_accepted_by_the_api_server(api, workload_crds, manifest):
    created = api.create(CREATE_PATHS[manifest] + DRY_RUN, example(manifest))
    assert created["metadata"]["name"] == "train-llm"


@pytest.mark.parametrize("manifest", sorted(CREATE_PATHS))
def test_a_misspelt_field_in_an_example_would_be_caught(api, workload_crds, manifest):
    broken = example(manifest)
    broken["spec"]["terminationGracePeriod"] = 300
    with pytest.raises(KubeRejected, match="terminationGracePeriod"):
        api.create(CREATE_PATHS[manifest] + DRY_RUN, broken)


def pod_templates(manifest: Json) -> list[Json]:
    spec = manifest["spec"]
    if manifest["kind"] == "Job":
        return [spec["template"]]
    if manifest["kind"] == "JobSet":
        return [r["template"]["spec"]["template"] for r in spec["replicatedJobs"]]
    return [r["template"] for r in spec["pytorchReplicaSpecs"].values()]


@pytest.mark.parametrize("manifest", sorted(CREATE_PATHS))
def test_examples_leave_sick_nodes_alone_and_give_time_to_checkpoint(manifest):
    templates = pod_templates(example(manifest))
    assert templates
    for template in templates:
        spec: dict[str, Any] = template["spec"]
        for toleration in spec.get("tolerations", []):
            assert toleration.get("key") not in (TAINT_KEY, None, "")
        assert spec["terminationGracePeriodSeconds"] >= LEAST_GRACE_S


@pytest.mark.parametrize("manifest", sorted(CREATE_PATHS))
def test_examples_run_their_script_under_gpuguard_run_with_checkpoints_on_the_volume(manifest):
    for template in pod_templates(example(manifest)):
        for container in template["spec"]["containers"]:
            command = container["command"]
            assert command[:2] == ["gpuguard", "run"]
            launcher = build_parser().parse_args(command[1:])  # exits on an unknown option
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            assert str(launcher.checkpoint_dir) in mounts
            job = [word for word in launcher.job_command if word != "--"]
            assert job[0] in ("python", "torchrun")
            if job[0] == "torchrun":  # one layer owns the retries: gpuguard run's
                assert "--max-restarts=0" in job

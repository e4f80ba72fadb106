"""Cloud maintenance events end to end: the real agent polls a metadata service on
loopback, its kernel condition turns False with the maintenance code, and the controller
cordons and drains the node (a reboot) or replaces it (a retirement)."""

from __future__ import annotations

import datetime

from tests.kube.test_controller import nodeclaim, start_agent  # noqa: F401  (a fixture)
from tests.support.cluster import make_node, wait_for
from tests.support.controllers import (
    POOL,
    node,
    node_name,
    remediations,
    status_of,
    tainted,
)
from tests.support.metadata_server import metadata_service
from tests.unit.test_maintenance_events import AWS_EXAMPLE, AZURE_EXAMPLE

KERNEL = "GpuguardKernelHealthy"


def _kernel_condition(api, name: str) -> dict[str, str]:
    found = [c for c in node(api, name)["status"].get("conditions", []) if c["type"] == KERNEL]
    return found[0] if found else {}


def test_aws_scheduled_reboot_cordons_and_drains(api, start_agent, start_controller):  # noqa: F811
    with metadata_service("aws") as service:
        service.answer(AWS_EXAMPLE)  # a system-reboot whose start has passed
        name = node_name()
        make_node(api, name, labels={POOL: "h100"})
        start_agent(name, maintenance={"provider": "aws", "endpoint": service.url})
        start_controller()
        condition = wait_for(
            lambda: (
                _kernel_condition(api, name).get("status") == "False"
                and _kernel_condition(api, name)
            ),
            what="the kernel condition False",
        )
        assert "MAINTENANCE_EVENT" in condition["message"]
        wait_for(lambda: node(api, name)["spec"].get("unschedulable"), 40, "cordon and drain")
        assert status_of(api, name)["rung"] in ("REBOOT", "REPLACE")


def test_gce_terminate_replaces_the_node(api, start_agent, start_controller):  # noqa: F811
    with metadata_service("gcp") as service:
        service.answer("TERMINATE_ON_HOST_MAINTENANCE")
        name = node_name()
        make_node(api, name, labels={POOL: "h100"})
        claim = nodeclaim(api, name)
        start_agent(name, maintenance={"provider": "gcp", "endpoint": service.url})
        start_controller()
        wait_for(lambda: status_of(api, name).get("rung") == "REPLACE", 60, "REPLACE")
        wait_for(
            lambda: (
                not any(
                    c["metadata"]["name"] == claim
                    for c in api.list("/apis/karpenter.sh/v1/nodeclaims").items
                )
            ),
            60,
            "the NodeClaim deleted",
        )


def test_flapping_and_failing_service_never_drains(api, start_agent, start_controller):  # noqa: F811
    with metadata_service("azure") as service:
        service.answer("<html>bad gateway</html>", 502)
        name = node_name()
        make_node(api, name, labels={POOL: "h100"})
        fast = {"interval_s": 0.5, "timeout_s": 0.5}
        start_agent(
            name,
            maintenance={
                "provider": "azure",
                "endpoint": service.url,
                "window_s": 2 * 86400,
                **fast,
            },
        )
        start_controller()
        wait_for(lambda: len(service.requests) >= 3, what="three polls")
        service.answer("x", delay_s=30)  # slow: beyond the poll's limit
        polled = len(service.requests)
        wait_for(lambda: len(service.requests) >= polled + 2, what="two slow polls")
        # A reboot a day away, in the window, that appears on every other poll only.
        far = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1)
        event = AZURE_EXAMPLE.replace('"Freeze"', '"Reboot"').replace(
            "Mon, 19 Sep 2016 18:29:47 GMT", far.strftime("%a, %d %b %Y %H:%M:%S GMT")
        )
        service.answer("")
        service.alternate = [event, '{"DocumentIncarnation": 2, "Events": []}']
        polled = len(service.requests)
        wait_for(lambda: len(service.requests) >= polled + 6, what="six flapping polls")
        assert _kernel_condition(api, name).get("status") == "True"
        assert not node(api, name)["spec"].get("unschedulable")
        assert not tainted(api, name)
        assert remediations(api, name) == []

"""Cloud maintenance events end to end: the real agent polls a metadata service on
loopback, its kernel condition turns False with the maintenance code, and the controller
cordons and drains the node, then waits for the cloud (a reboot), or replaces it (a
retirement)."""

from __future__ import annotations

import datetime

from tests.kube.test_controller import nodeclaim, start_agent  # noqa: F401  (a fixture)
from tests.support.cluster import make_node, wait_for
from tests.support.controllers import (
    POOL,
    kernel_condition,
    node,
    node_name,
    reconciled,
    remediations,
    status_of,
    tainted,
)
from tests.support.metadata_server import metadata_service
from tests.unit.test_maintenance_events import AWS_EXAMPLE, AZURE_EXAMPLE


def test_aws_scheduled_reboot_drains_and_waits_for_aws_never_replacing(
    api,
    start_agent,  # noqa: F811
    start_controller,
):
    with metadata_service("aws") as service:
        service.answer(AWS_EXAMPLE)  # a system-reboot whose start has passed
        name = node_name()
        make_node(api, name, labels={POOL: "h100"})
        claim = nodeclaim(api, name)
        bundle = start_agent(name, maintenance={"provider": "aws", "endpoint": service.url})
        controller = start_controller()
        condition = wait_for(
            lambda: (
                kernel_condition(api, name).get("status") == "False" and kernel_condition(api, name)
            ),
            what="the kernel condition False",
        )
        assert "MAINTENANCE_EVENT" in condition["message"]
        wait_for(lambda: node(api, name)["spec"].get("unschedulable"), 40, "cordon and drain")
        wait_for(lambda: "reboot" in (bundle / "repairs.log").read_text(), 40, "our reboot")
        # AWS keeps the event open after a reboot of ours: held drained, no further rung.
        wait_for(
            lambda: any("held drained" in s["message"] for s in status_of(api, name)["steps"]),
            40,
            "the episode held for AWS",
        )
        reconciled(controller, times=3)
        assert status_of(api, name)["rung"] == "REBOOT"
        assert node(api, name)["spec"].get("unschedulable") and tainted(api, name)
        assert api.get(f"/apis/karpenter.sh/v1/nodeclaims/{claim}")["metadata"]["name"] == claim
        # AWS did its reboot: the event is completed, and the node goes back to work.
        service.answer(AWS_EXAMPLE.replace('"active"', '"completed"'))
        wait_for(
            lambda: not node(api, name)["spec"].get("unschedulable") and not tainted(api, name),
            60,
            "the node back in service",
        )


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


def test_azure_reboot_drains_then_approves_the_event(api, start_agent, start_controller):  # noqa: F811
    soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=10)
    event = AZURE_EXAMPLE.replace('"Freeze"', '"Reboot"').replace(
        "Mon, 19 Sep 2016 18:29:47 GMT", soon.strftime("%a, %d %b %Y %H:%M:%S GMT")
    )
    with metadata_service("azure") as service:
        service.answer(event)
        name = node_name()
        make_node(api, name, labels={POOL: "h100"})
        fast = {"interval_s": 0.5, "timeout_s": 0.5}
        bundle = start_agent(
            name, maintenance={"provider": "azure", "endpoint": service.url, **fast}
        )
        start_controller()
        wait_for(lambda: node(api, name)["spec"].get("unschedulable"), 40, "cordon and drain")
        # The controller asks for the reboot once drained; the agent approves the event then.
        wait_for(lambda: service.acknowledged, 40, "the event approved")
        assert service.acknowledged[0] == {
            "StartRequests": [{"EventId": "f020ba2e-3bc0-4c40-a10b-86575a9eabd5"}]
        }
        assert "reboot" in (bundle / "repairs.log").read_text()
        assert node(api, name)["spec"].get("unschedulable")


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
        assert kernel_condition(api, name).get("status") == "True"
        assert not node(api, name)["spec"].get("unschedulable")
        assert not tainted(api, name)
        assert remediations(api, name) == []

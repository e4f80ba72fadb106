"""Custom check plugins end to end: the real agent runs a team's program, its finding turns
the layer's condition False, and the controller quarantines the node through the usual
path; a plugin that hangs leaves the agent publishing, and its fix clears the node."""

from __future__ import annotations

import pytest

from gpuguard.controller.loop import Controller
from tests.kube.test_controller import start_agent  # noqa: F401  (a fixture)
from tests.support.cluster import make_node, wait_for
from tests.support.controllers import (
    POOL,
    kernel_condition,
    node,
    node_name,
    reconciled,
    status_of,
    tainted,
)
from tests.unit.test_fail_closed import make_tool


@pytest.fixture
def watched(api, start_agent, start_controller, tmp_path):  # noqa: F811
    """A node whose agent runs the plugin ``body`` (and ``codes``), and a controller."""

    def start(body: str, **codes: dict[str, str]) -> tuple[str, Controller]:
        name = node_name()
        make_node(api, name, labels={POOL: "h100"})
        program = make_tool(tmp_path, "team-check", body)
        plugin = {"name": "nfs", "command": [str(program)], "interval_s": 0.5, "timeout_s": 1}
        start_agent(name, plugins=[{**plugin, "codes": codes}])
        return name, start_controller()

    return start


def test_a_plugins_critical_finding_quarantines_the_node(api, watched):
    name, controller = watched("#!/bin/sh\necho '/data: stale file handle'\nexit 1\n")
    condition = wait_for(
        lambda: (
            kernel_condition(api, name).get("status") == "False" and kernel_condition(api, name)
        ),
        what="the kernel condition False",
    )
    assert "PLUGIN_NFS" in condition["message"]
    wait_for(lambda: tainted(api, name), what="the node quarantined")
    # The operator mapped no repair to the code: quarantined, never drained or rebooted.
    reconciled(controller, times=3)
    status = status_of(api, name)
    assert status["phase"] == "Quarantined" and not status.get("rung"), status
    assert not node(api, name)["spec"].get("unschedulable")


def test_a_plugin_code_the_operator_maps_to_reboot_climbs_the_ladder(api, watched):
    reboot = {"severity": "critical", "action": "REBOOT"}
    name, _ = watched("#!/bin/sh\necho 'kernel soft lockups: 14'\nexit 1\n", PLUGIN_NFS=reboot)
    wait_for(lambda: node(api, name)["spec"].get("unschedulable"), 40, "cordon and drain")
    assert status_of(api, name)["rung"] == "REBOOT"


def test_a_hung_plugin_leaves_the_agent_publishing_and_its_fix_clears_the_node(
    api, watched, tmp_path
):
    name, _ = watched("#!/bin/sh\nexec sleep 1000\n")
    condition = wait_for(
        lambda: (
            "CHECK_TIMED_OUT" in kernel_condition(api, name).get("message", "")
            and kernel_condition(api, name)
        ),
        what="the hung plugin reported",
    )
    assert condition["status"] == "False"  # fail closed: no verdict is no health
    wait_for(lambda: tainted(api, name), what="the node quarantined")
    make_tool(tmp_path, "team-check", "#!/bin/sh\nexit 0\n")
    wait_for(
        lambda: kernel_condition(api, name).get("status") == "True", 30, "the condition True again"
    )
    wait_for(lambda: not tainted(api, name), 60, "the node back in service")

"""A dead agent is noticed whatever came first (issue 28, chaos round 2, defects 2 and 3;
docs/reliability.md R2-2, R2-3): the controller installed before any agent, the agent
before the controller, the pool scaled to zero and back, a controller restarted while an
agent is dead. Real ``gpuguard controller`` processes; the stand-in agent writes a fresh
report every second while it lives. Each order ends with the dead agent's node tainted
within ``agent_timeout_s + unknown_grace_s`` of its last report (plus the controller's
pass), and never untainted after that.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from gpuguard.kube.rest import KubeApi
from tests.chaos.conftest import Controllers, quiet_for
from tests.chaos.test_controller_faults import new_node
from tests.support.cluster import set_health, wait_for
from tests.support.controllers import POOL, PROCESS_POLICY, tainted

AGENT_TIMEOUT_S, GRACE_S = 4.0, 2.0
POLICY = {**PROCESS_POLICY, "agent_timeout_s": AGENT_TIMEOUT_S, "unknown_grace_s": GRACE_S}
PASS_S = 3.0  # a controller pass and its writes, on a loaded 2-core machine
HELD_S = 4.0  # how long a tainted node is watched for a release


class Agent:
    """A stand-in agent: a fresh report every second until it dies."""

    def __init__(self, api: KubeApi, name: str) -> None:
        self.api, self.name = api, name
        self._stop = threading.Event()
        self.last_report = time.monotonic()
        set_health(api, name)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            set_health(self.api, self.name)
            self.last_report = time.monotonic()

    def die(self) -> float:
        """Stop reporting; when (monotonic) its last report was written."""
        self._stop.set()
        self._thread.join(5)
        return self.last_report


@contextmanager
def agent(api: KubeApi, name: str) -> Iterator[Agent]:
    live = Agent(api, name)
    try:
        yield live
    finally:
        live.die()


def pool_nodes(api: KubeApi) -> list[str]:
    return [n["metadata"]["name"] for n in api.list("/api/v1/nodes", label_selector=POOL).items]


def alive_and_untainted(api: KubeApi, name: str) -> None:
    """While its agent reports, the node is never tainted (for longer than a timeout)."""
    seen = quiet_for(AGENT_TIMEOUT_S + GRACE_S, lambda: [name] if tainted(api, name) else [])
    assert seen == [], "a node whose agent reports was tainted"


def lives_then_dies(api: KubeApi, live: Agent) -> None:
    """The node stays untainted while its agent reports, then is tainted in time once the
    agent dies, and held."""
    alive_and_untainted(api, live.name)
    tainted_in_time_and_held(api, live.name, live.die())


def tainted_in_time_and_held(api: KubeApi, name: str, last_report: float) -> None:
    deadline = AGENT_TIMEOUT_S + GRACE_S + PASS_S
    wait_for(lambda: tainted(api, name), deadline + 5, "the dead agent's node tainted")
    assert time.monotonic() - last_report <= deadline, "tainted, but late"
    released = quiet_for(HELD_S, lambda: [] if tainted(api, name) else [name])
    assert released == [], "the dead agent's node was untainted"


def test_controller_first_then_an_agent_that_dies(audited_api, controllers: Controllers):
    api = audited_api
    controllers.wait_leading(controllers.start("only", POLICY))  # finds no agent anywhere
    with agent(api, new_node(api)) as live:
        lives_then_dies(api, live)


def test_agent_first_then_the_controller_then_the_agent_dies(audited_api, controllers: Controllers):
    api = audited_api
    with agent(api, new_node(api)) as live:
        controllers.wait_leading(controllers.start("only", POLICY))
        lives_then_dies(api, live)


def test_a_pool_scaled_to_zero_and_back_then_an_agent_dies(audited_api, controllers: Controllers):
    api = audited_api
    first = new_node(api)
    with agent(api, first):
        controllers.wait_leading(controllers.start("only", POLICY))
    api.delete(f"/api/v1/nodes/{first}")  # scaled to zero
    wait_for(lambda: not pool_nodes(api), 10, "the pool empty")
    # A whole agent timeout of scans that find no agent anywhere.
    assert quiet_for(AGENT_TIMEOUT_S, lambda: pool_nodes(api)) == []
    with agent(api, new_node(api)) as live:  # and back
        lives_then_dies(api, live)


def test_a_controller_restarted_while_an_agent_is_dead_never_releases_its_node(
    audited_api, controllers: Controllers
):
    api = audited_api
    name = new_node(api)
    with agent(api, name) as live:
        first = controllers.start("first", POLICY)
        controllers.wait_leading(first)
        last = live.die()
    tainted_in_time_and_held(api, name, last)

    first.stop()  # SIGTERM: the Lease is handed over at once
    second = controllers.start("second", POLICY)
    controllers.wait_leading(second)
    # From the new process's first look on, through a whole agent timeout and grace.
    released = quiet_for(
        AGENT_TIMEOUT_S + GRACE_S + PASS_S, lambda: [] if tainted(api, name) else [name]
    )
    assert released == [], "the restarted controller released a dead agent's node"

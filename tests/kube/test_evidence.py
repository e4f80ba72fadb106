"""RMA evidence on the real API server: a person's request on the Node leaves a readable
archive in the evidence directory, the agent's answer names it, and so does an Event."""

from __future__ import annotations

import json

from gpuguard.cli import main
from gpuguard.contract.keys import EVIDENCE_ANNOTATION, EVIDENCE_REQUEST_ANNOTATION
from tests.kube.test_agent import GPU, bundle_from, condition_is, events_for, start_agent
from tests.support.cluster import wait_for

__all__ = ["start_agent"]  # the fixture, used by name
EXPECT = ["--expected-gpus", "1", "--expected-nics", "3", "--expected-link-gbps", "400"]


def test_a_request_leaves_a_readable_archive_and_an_event_naming_it(
    control_plane, node, start_agent, tmp_path, capsys
):
    sources, log = bundle_from("healthy-h100", tmp_path)
    store = tmp_path / "evidence"
    start_agent(node, sources, log, evidence={"directory": store})
    wait_for(condition_is(control_plane, node, GPU, "True", "Healthy"), what="first report")
    request = {"metadata": {"annotations": {EVIDENCE_REQUEST_ANNOTATION: "ticket-1234"}}}
    control_plane.request("PATCH", f"/api/v1/nodes/{node}", request, "application/merge-patch+json")

    def answer() -> dict[str, str] | None:
        node_object = control_plane.request("GET", f"/api/v1/nodes/{node}")
        value = node_object["metadata"].get("annotations", {}).get(EVIDENCE_ANNOTATION)
        return json.loads(value) if value else None

    found = wait_for(answer, what="the agent's evidence answer")
    assert found["request"] == "ticket-1234"
    archive = store / found["location"].rsplit("/", 1)[-1]
    assert found["location"] == str(archive) and archive.is_file()

    def evidence_notes() -> list[str]:
        events = events_for(control_plane, node)
        return [e["note"] for e in events if e["reason"] == "EvidenceCollected"]

    notes = wait_for(evidence_notes, what="the evidence Event")
    assert notes == [f"evidence for RMA: {archive}"]
    assert main(["check", "--bundle", str(archive), *EXPECT]) == 0

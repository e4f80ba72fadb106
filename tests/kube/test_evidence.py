"""RMA evidence on the real API server: a person's request on the Node, or a REPLACE with
the controller's evidence wait on, leaves a readable archive in the evidence directory (or
an S3-compatible bucket) and an Event naming it; with no answer the REPLACE goes ahead once
the wait is over."""

from __future__ import annotations

import json
import socket
import tempfile
from pathlib import Path

from gpuguard.cli import main
from gpuguard.contract.keys import EVIDENCE_ANNOTATION, EVIDENCE_REQUEST_ANNOTATION
from gpuguard.controller.events import EventRecorder
from gpuguard.controller.evidence_gate import EvidenceGate
from tests.kube.test_agent import GPU, XID79, bundle_from, condition_is, events_for, start_agent
from tests.support.cluster import make_node, wait_for
from tests.support.controllers import POOL, node, node_name, only_rung, status_of
from tests.support.s3_server import BUCKET, s3_server

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


def ask_and_answer(control_plane, node: str, request_id: str) -> tuple[str, str]:
    """Ask the node's agent for evidence; returns its answer's location and Event note."""
    request = {"metadata": {"annotations": {EVIDENCE_REQUEST_ANNOTATION: request_id}}}
    control_plane.request("PATCH", f"/api/v1/nodes/{node}", request, "application/merge-patch+json")

    def answer() -> dict[str, str] | None:
        node_object = control_plane.request("GET", f"/api/v1/nodes/{node}")
        value = node_object["metadata"].get("annotations", {}).get(EVIDENCE_ANNOTATION)
        found = json.loads(value) if value else None
        return found if found and found["request"] == request_id else None

    found = wait_for(answer, what="the agent's answer to this request")

    def evidence_note() -> str | None:
        events = events_for(control_plane, node)
        return next((e["note"] for e in events if e["reason"].startswith("Evidence")), None)

    return found["location"], wait_for(evidence_note, what="the evidence Event")


def test_with_a_bucket_the_archive_is_uploaded_and_the_event_names_it(
    control_plane, node, start_agent, tmp_path, monkeypatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the agent packs it
    sources, log = bundle_from("healthy-h100", tmp_path)
    with s3_server() as s3:
        for name, value in s3.environ().items():
            monkeypatch.setenv(name, value)
        store = {"s3": {"endpoint": s3.endpoint, "bucket": BUCKET, "prefix": "rma/"}}
        start_agent(node, sources, log, evidence=store)
        wait_for(condition_is(control_plane, node, GPU, "True", "Healthy"), what="first report")
        location, note = ask_and_answer(control_plane, node, "ticket-s3")
        assert location.startswith(f"s3://{BUCKET}/rma/{node}-")
        assert note == f"evidence for RMA: {location} (endpoint {s3.endpoint})"
        key = location.removeprefix(f"s3://{BUCKET}/")
        archive = tmp_path / "downloaded.tar.gz"
        archive.write_bytes(s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read())
    assert not list(tmp_path.glob("gpuguard-evidence-*")), "the local archive is removed"
    assert main(["check", "--bundle", str(archive), *EXPECT]) == 0


KEPT_UNTIL = " until the next request"


def test_an_unreachable_bucket_is_a_warning_event_and_the_agent_goes_on(
    control_plane, node, start_agent, tmp_path, monkeypatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    sources, log = bundle_from("healthy-h100", tmp_path)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
        store = {"s3": {"endpoint": endpoint, "bucket": BUCKET, "timeout_s": 5}}
        agent = start_agent(node, sources, log, evidence=store)
        wait_for(condition_is(control_plane, node, GPU, "True", "Healthy"), what="first report")
        location, note = ask_and_answer(control_plane, node, "ticket-down")
        assert location == ""
        assert note.startswith("evidence for RMA not collected: PUT s3://gpuguard-evidence/")
        assert f"at {endpoint}: " in note and "Connection refused; the archive stays at " in note
        kept = Path(note.rsplit("; the archive stays at ", 1)[1].removesuffix(KEPT_UNTIL))
        assert kept.is_file() and kept.parent.parent == tmp_path
        ask_and_answer(control_plane, node, "ticket-down-again")
    (scratch,) = tmp_path.glob("gpuguard-evidence-*")  # only the latest failure's archive
    assert scratch != kept.parent and list(scratch.glob("*.tar.gz"))
    assert agent.thread.is_alive()


# --- before a REPLACE: the controller asks, waits a bounded time, then replaces ---------
def replace_with_evidence_gate(
    api, start_agent, start_controller, tmp_path, wait_s: float, **agent_settings
) -> tuple[str, str]:
    """A node whose Xid 79 goes straight to REPLACE with the gate on; returns the node
    and the controller's evidence Event note once it replaced the node."""
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    sources, log = bundle_from("healthy-h100", tmp_path)
    start_agent(name, sources, log, **agent_settings)
    controller = start_controller("delete-node", max_attempts=only_rung("REPLACE"))
    controller.applier.evidence = EvidenceGate(controller.writer, controller.applier.events, wait_s)
    wait_for(lambda: node(api, name)["status"].get("conditions"), what="the first report")
    with log.open("a") as handle:
        handle.write(XID79)

    def evidence_note() -> str | None:
        events = api.list("/apis/events.k8s.io/v1/namespaces/default/events").items
        notes = [e["note"] for e in events if e["regarding"]["name"] == name]
        return next((n for n in notes if "evidence for RMA" in n and "replacing" in n), None)

    note = wait_for(evidence_note, 60, "the controller's evidence Event")
    wait_for(lambda: status_of(api, name).get("resolution") == "Replaced", 30, "replaced")
    return name, note


def test_a_replace_leaves_a_readable_archive_and_the_event_names_it(
    api, start_agent, start_controller, tmp_path
):
    store = tmp_path / "evidence"
    name, note = replace_with_evidence_gate(
        api, start_agent, start_controller, tmp_path, 60, evidence={"directory": store}
    )
    archive = Path(note.removeprefix("replacing; evidence for RMA: "))
    assert archive.parent == store and archive.name.startswith(f"{name}-")
    assert main(["check", "--bundle", str(tmp_path / "bundle"), *EXPECT]) == 2  # the Xid 79
    assert main(["check", "--bundle", str(archive), *EXPECT]) == 2


def test_without_an_answer_the_replace_goes_ahead_after_the_wait(
    api, start_agent, start_controller, tmp_path
):
    _, note = replace_with_evidence_gate(api, start_agent, start_controller, tmp_path, 2)
    assert note == "replacing without evidence for RMA: no answer in 2s"


def test_a_wait_no_pass_pursued_is_not_taken_for_the_next_replace(api):
    """An episode that asked for evidence and then ended without a replacement leaves its
    request behind; a REPLACE much later asks afresh instead of replacing at once."""
    name = node_name()
    make_node(api, name, labels={POOL: "h100"})
    gate = EvidenceGate(api, EventRecorder(api, "test"), wait_s=60)
    assert not gate.ready(name, 1_000.0)
    first = node(api, name)["metadata"]["annotations"][EVIDENCE_REQUEST_ANNOTATION]
    assert not gate.ready(name, 1_030.0)  # still waiting
    assert not gate.ready(name, 5_000.0), "an old request must not stand in for a new one"
    second = node(api, name)["metadata"]["annotations"][EVIDENCE_REQUEST_ANNOTATION]
    assert second != first

"""The agent's reading of the verdicts jobs write (check ``in-job``): what each kind calls
for, the deferred repair released by the job's checkpoint, and what is never acted on."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from gpuguard.agent.daemon import Agent
from gpuguard.checks.base import CheckContext
from gpuguard.checks.in_job.verdict_check import InJobCheck, forget_verdicts
from gpuguard.checks.load.deep_run import DeepRun
from gpuguard.config import Config
from gpuguard.kernel_log.followers import FileFollower
from gpuguard.model import Action, CheckResult, Layer, Outcome, Severity, Status, assess_layer
from gpuguard.runner import run_check
from gpuguard.sources import BundleSources
from gpuguard.training.verdicts import Verdict, VerdictKind, read_verdicts, write_verdict

GPU = "00000000:1B:00.0"


def verdict(kind: VerdictKind = VerdictKind.FAIL_SLOW, **changes: object) -> Verdict:
    now = time.time()
    base = Verdict(
        kind=kind,
        job="team-a/llama-70b",
        rank=5,
        world_size=16,
        node="gpu-node-7",
        gpu=GPU,
        since=now - 120,
        written_at=now,
        ratio=0.0 if kind.endswith("_mismatch") else 1.17,
        steps=(400, 460),
        evidence="compute 0.351 s vs median 0.300 s over 6 windows",
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def findings(bundle: Path, node: str | None = "gpu-node-7"):
    ctx = CheckContext(BundleSources(bundle), Config(), 5.0)
    result = run_check(InJobCheck(node=node), ctx)
    assert result.answered, result.detail
    return result.findings


def in_job(tmp_path: Path) -> Path:
    directory = tmp_path / "in-job"
    directory.mkdir()
    return directory


def test_fail_slow_is_a_deferred_replace_of_the_named_gpu(tmp_path):
    write_verdict(in_job(tmp_path), verdict())
    (found,) = findings(tmp_path)
    assert (found.code, found.layer, found.action) == (
        "IN_JOB_FAIL_SLOW",
        Layer.GPU,
        Action.REPLACE,
    )
    assert found.deferred and found.severity is Severity.WARNING
    assert found.component.id == "0000:1b:00.0"
    assert "rank 5 of 16 of job team-a/llama-70b" in found.message and "1.17x" in found.message
    assert "steps 400-460" in found.evidence
    layer = assess_layer(Layer.GPU, [found], ["nvml"], [])
    assert layer.status is Status.UNHEALTHY and layer.deferred


def test_a_checkpoint_after_the_verdict_releases_the_repair(tmp_path):
    v = verdict()
    write_verdict(in_job(tmp_path), dataclasses.replace(v, checkpointed_at=v.since + 60))
    (found,) = findings(tmp_path)
    assert found.code == "IN_JOB_FAIL_SLOW" and not found.deferred
    assert found.severity is Severity.CRITICAL and found.action is Action.REPLACE
    layer = assess_layer(Layer.GPU, [found], ["nvml"], [])
    assert layer.status is Status.UNHEALTHY and not layer.deferred


@pytest.mark.parametrize(
    ("kind", "code", "what"),
    [
        (VerdictKind.REPLICA_MISMATCH, "IN_JOB_REPLICA_MISMATCH", "parameters differ"),
        (VerdictKind.COMPUTE_MISMATCH, "IN_JOB_COMPUTE_MISMATCH", "gradients of the probe"),
    ],
)
def test_wrong_results_are_repaired_at_once(tmp_path, kind, code, what):
    write_verdict(in_job(tmp_path), verdict(kind))
    (found,) = findings(tmp_path)
    assert found.code == code and not found.deferred and what in found.message
    assert (found.severity, found.action) == (Severity.CRITICAL, Action.REPLACE)
    layer = assess_layer(Layer.GPU, [found], ["nvml"], [])
    assert layer.status is Status.UNHEALTHY and not layer.deferred


def test_link_slow_is_reported_on_the_network_layer_without_a_repair(tmp_path):
    write_verdict(in_job(tmp_path), verdict(VerdictKind.LINK_SLOW))
    (found,) = findings(tmp_path)
    assert (found.code, found.layer, found.action) == (
        "IN_JOB_LINK_SLOW",
        Layer.NETWORK,
        Action.NONE,
    )
    assert "communication 1.17x" in found.message


def test_a_verdict_its_job_no_longer_refreshes_still_stands(tmp_path):
    now = time.time()
    write_verdict(in_job(tmp_path), verdict(written_at=now - 1000, since=now - 2000))
    (found,) = findings(tmp_path)
    assert found.code == "IN_JOB_FAIL_SLOW" and found.deferred
    assert "not refreshed for 1000s (the job has ended)" in found.evidence


def test_a_verdict_about_another_node_or_a_garbled_file_is_reported_never_acted_on(tmp_path):
    directory = in_job(tmp_path)
    write_verdict(directory, verdict(node="gpu-node-8"))
    (directory / "broken.rank0.verdict.json").write_text('{"version": 1, "kind": "fast"}')
    found = findings(tmp_path)
    assert [f.code for f in found] == ["IN_JOB_VERDICT_INVALID"] * 2
    assert all(f.action is Action.NONE and f.severity is Severity.INFO for f in found)
    messages = " ".join(f.message for f in found)
    assert "'gpu-node-8', not 'gpu-node-7'" in messages
    assert "broken.rank0.verdict.json: kind 'fast' is not one of" in messages


def test_no_directory_yet_is_an_answer_with_nothing_in_it(tmp_path):
    assert findings(tmp_path) == []


def test_a_repair_forgets_the_verdicts_it_answered_but_not_newer_ones(tmp_path):
    directory = in_job(tmp_path)
    repaired_at = time.time()
    write_verdict(directory, verdict(written_at=repaired_at - 5))
    other = verdict(rank=6, gpu="00000000:1C:00.0", written_at=repaired_at - 5)
    write_verdict(directory, other)
    assert forget_verdicts(directory, ["0000:1b:00.0"], repaired_at) == 1
    assert [v.rank for v in read_verdicts(directory)[0]] == [6]
    write_verdict(directory, verdict(written_at=repaired_at + 5))  # refreshed after it
    assert forget_verdicts(directory, [], repaired_at) == 1  # a node rung: every older one
    assert [v.rank for v in read_verdicts(directory)[0]] == [5]


@pytest.mark.parametrize(
    ("action", "left"),
    [(Action.RESET_GPU, [6]), (Action.REBOOT, []), (Action.KILL_JOB, [5, 6])],
)
def test_the_agent_forgets_what_its_repair_answered(tmp_path, action, left):
    directory = in_job(tmp_path)
    repaired_at = time.time()
    write_verdict(directory, verdict(written_at=repaired_at - 5))
    write_verdict(directory, verdict(rank=6, gpu="00000000:1C:00.0", written_at=repaired_at - 5))
    (tmp_path / "kmsg.log").write_text("")
    follower = FileFollower(tmp_path / "kmsg.log", 0.05)
    agent = Agent(Config(), BundleSources(tmp_path), [], follower, "gpu-node-7", api=None)
    agent.after_repair(action, ("00000000:1B:00.0",), repaired_at)
    assert sorted(v.rank for v in read_verdicts(directory)[0]) == left


@pytest.mark.parametrize(
    ("outcome", "left"),
    [(Outcome.OK, [2, 7]), (Outcome.TOOL_MISSING, [2, 5, 7])],
)
def test_a_passing_deep_run_forgets_the_fail_slow_verdicts_written_before_it(
    tmp_path, outcome, left
):
    # Slowness a second measurement does not confirm: the verdict goes, so the node is not
    # held for it; a mismatch (wrong results) and a newer verdict stay.
    directory = in_job(tmp_path)
    finished = time.time()
    write_verdict(directory, verdict(written_at=finished - 120))  # rank 5
    write_verdict(
        directory, verdict(VerdictKind.REPLICA_MISMATCH, rank=2, written_at=finished - 120)
    )
    write_verdict(directory, verdict(rank=7, written_at=finished - 10))  # during the run
    (tmp_path / "kmsg.log").write_text("")
    follower = FileFollower(tmp_path / "kmsg.log", 0.05)
    agent = Agent(Config(), BundleSources(tmp_path), [], follower, "gpu-node-7", api=None)
    result = CheckResult("deep-gpu", Layer.GPU, outcome, duration_s=60.0)
    agent.after_deep_run(DeepRun("verify", result, finished, "2026-12-03T00:00:00Z"))
    assert sorted(v.rank for v in read_verdicts(directory)[0]) == left

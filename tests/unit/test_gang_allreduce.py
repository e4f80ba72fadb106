"""The cross-node (gang) check with real processes: gang members on 127.0.0.1 meet with
torch.distributed (gloo, CPU), run the all-reduce series and agree on which member the
others waited on. The slowed member is named by its node and only its own container
fails; with no slow member no one is named; a member that never shows up is a note."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuguard.checks.gang.judge import (
    GANG_ALLREDUCE_SLOW,
    GANG_STRAGGLER,
    MemberTimings,
    judge_gang,
)
from gpuguard.checks.gang.rendezvous import GangConfigError, gang_spec
from gpuguard.contract.preflight import FAILED, PASSED, PreflightResult, read_result
from tests.support.controlplane import free_port
from tests.support.preflight_node import DELAY_ENV

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
DELAY_S = 0.5  # per all-reduce: five times the judge's noise floor
GANG_TIMEOUT_S = 5
WAIT_S = 120  # the members' deadline: start-up of torch on a busy 2-core machine included


@dataclass
class Member:
    code: int
    result: PreflightResult
    output: str


def run_gang(tmp_path: Path, world: int, started: int, slow_rank: int | None) -> list[Member]:
    """``started`` members of a gang of ``world`` (the rest never show up), each a process
    running ``gpuguard preflight --gang`` on a healthy simulated node."""
    config = tmp_path / "config.yaml"
    config.write_text("deep:\n  matmul_size: 48\n  memory_test_fraction: 0.5\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUGUARD_", "TORCHELASTIC"))}
    env.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(world),
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",
    )
    procs = []
    for rank in range(started):
        own = {**env, "RANK": str(rank), "NODE_NAME": f"node-{rank}", "POD_NAME": f"pod-{rank}"}
        if rank == slow_rank:
            own[DELAY_ENV] = str(DELAY_S)
        argv = [sys.executable, "-m", "tests.support.preflight_node", "healthy", "--budget", "1"]
        argv += ["--config", str(config), "--termination-log", str(tmp_path / f"log-{rank}")]
        argv += ["--gang", "--gang-mib", "1", "--gang-timeout", str(GANG_TIMEOUT_S)]
        procs.append(
            subprocess.Popen(
                argv, cwd=REPO, env=own, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    members = []
    try:
        for rank, proc in enumerate(procs):
            output, _ = proc.communicate(timeout=WAIT_S)
            result = read_result((tmp_path / f"log-{rank}").read_text())
            assert result is not None, output
            members.append(Member(proc.returncode, result, output))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    return members


def test_the_slowed_member_is_named_and_only_its_container_fails(tmp_path):
    members = run_gang(tmp_path, world=3, started=3, slow_rank=1)
    outputs = "\n".join(m.output for m in members)
    assert [m.code for m in members] == [0, 1, 0], outputs
    assert [m.result.status for m in members] == [PASSED, FAILED, PASSED]
    assert all(m.result.slow_nodes == ("node-1",) for m in members), outputs
    assert members[1].result.codes == (GANG_STRAGGLER,)
    assert "the gang waited on node-1 (rank 1" in members[0].result.message


def test_with_no_slow_member_no_one_is_named(tmp_path):
    members = run_gang(tmp_path, world=3, started=3, slow_rank=None)
    outputs = "\n".join(m.output for m in members)
    assert [m.code for m in members] == [0, 0, 0], outputs
    assert all(m.result.slow_nodes == () and m.result.codes == () for m in members), outputs
    assert all("3 members, all-reduce" in m.result.message for m in members)


def test_a_member_that_never_shows_up_is_a_note_not_a_failure(tmp_path):
    members = run_gang(tmp_path, world=3, started=2, slow_rank=None)
    outputs = "\n".join(m.output for m in members)
    assert [m.code for m in members] == [0, 0], outputs
    for member in members:
        assert member.result.status == PASSED and member.result.slow_nodes == ()
        assert "gang check skipped: the 3 members did not all take part within 5s" in (
            member.result.message
        )


def timings(rank: int, inside: list[float]) -> MemberTimings:
    return MemberTimings(rank, f"node-{rank}", f"pod-{rank}", (0.0,) * len(inside), tuple(inside))


MIB = 1 << 20


def test_the_judge_names_the_member_the_others_wait_on():
    # Rank 2 arrives 0.3 s late to each all-reduce: the others sit inside it that long.
    members = [
        timings(0, [0.31, 0.32, 0.30]),
        timings(1, [0.30, 0.31, 0.31]),
        timings(2, [0.01] * 3),
    ]
    verdict = judge_gang(members, MIB)
    assert verdict.slow_nodes == ("node-2",)
    assert verdict.codes == (GANG_STRAGGLER,)
    assert [round(m.late_s, 2) for m in verdict.members] == [0.0, 0.01, 0.3]


def test_the_judge_takes_noise_below_its_floor_for_noise():
    members = [
        timings(0, [0.05, 0.01, 0.02]),
        timings(1, [0.01, 0.06, 0.01]),
        timings(2, [0.01] * 3),
    ]
    verdict = judge_gang(members, MIB)
    assert verdict.slow_nodes == () and verdict.codes == ()


def test_a_gang_slow_as_a_whole_names_no_one_against_the_expected_figure():
    members = [timings(rank, [0.01, 0.011, 0.01]) for rank in range(4)]
    verdict = judge_gang(members, MIB, expected_gbps=100.0)
    assert verdict.gang_gbps == pytest.approx(2 * 3 / 4 * MIB * 8 / 0.01 / 1e9)
    assert verdict.slow_nodes == () and verdict.codes == (GANG_ALLREDUCE_SLOW,)
    assert "no member to name" in verdict.message


def test_the_gang_comes_from_torch_s_environment():
    env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "4"}
    spec = gang_spec({**env, "JOB_COMPLETION_INDEX": "3", "NODE_NAME": "gpu-7"})
    assert (spec.rank, spec.node, spec.init_method) == (3, "gpu-7", "tcp://10.0.0.1:29500")
    assert gang_spec({**env, "RANK": "1", "JOB_COMPLETION_INDEX": "3"}).rank == 1
    assert gang_spec({**env, "MASTER_ADDR": "fd00::1", "RANK": "0"}).init_method == (
        "tcp://[fd00::1]:29500"
    )
    for bad, why in [
        ({"RANK": "4"}, "rank 4 outside WORLD_SIZE=4"),
        ({"RANK": "x"}, "RANK='x': not a whole number"),
        ({"RANK": "0", "WORLD_SIZE": "1"}, "WORLD_SIZE=1: a gang needs two members or more"),
        ({}, "RANK (or JOB_COMPLETION_INDEX) not set"),
    ]:
        with pytest.raises(GangConfigError, match=None) as error:
            gang_spec({**env, **bad})
        assert str(error.value) == why

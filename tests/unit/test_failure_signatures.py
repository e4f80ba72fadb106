"""The failure signatures: each row recognises its own example, the precedence is the
conservative one, and no input makes classify raise."""

from __future__ import annotations

import csv
from importlib import resources

import pytest

from gpuguard.remediation.signatures import DETAIL_CHARS, TAIL_CHARS, classify, rules

ROWS = list(
    csv.DictReader(
        resources.files("gpuguard").joinpath("data/failure_signatures.csv").read_text().splitlines()
    )
)

# A rank of a PyTorch job whose InfiniBand peer stopped answering, as ProcessGroupNCCL
# and NCCL print it (NCCL 2.20, the watchdog's exception and NCCL's last error).
NCCL_IB_FAILURE = """\
[rank9]:[E ProcessGroupNCCL.cpp:583] [Rank 9] Some NCCL operations have failed or timed out.
[rank9]:[E ProcessGroupNCCL.cpp:1414] [PG 0 Rank 9] Process group watchdog thread \
terminated with exception: NCCL error: remote process exited or there was a network error, \
NCCL version 2.20.5
ncclRemoteError: A call failed possibly due to a network error or a remote process exiting \
prematurely.
Last error:
NET/IB : Got completion from peer 10.5.0.34<33956> with error 5, opcode 0, len 1, vendor err \
244 (Recv) localGid ::ffff:10.6.0.35 remoteGid ::ffff:10.5.0.34
"""
TRACEBACK_OF_NCCL = """\
Traceback (most recent call last):
  File "/workspace/train.py", line 211, in <module>
    dist.all_reduce(loss)
torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/\
ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), \
NCCL version 2.21.5
"""
OOM_THEN_PEERS = """\
Traceback (most recent call last):
  File "/workspace/train.py", line 180, in step
    out = model(batch)
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total \
capacity of 79.11 GiB of which 3.19 GiB is free.
[E ProcessGroupNCCL.cpp:1414] NCCL error: remote process exited or there was a network error
"""
KEY_ERROR = """\
Traceback (most recent call last):
  File "/workspace/train.py", line 42, in <module>
    lr = config["learning_rate"]
KeyError: 'learning_rate'
"""


@pytest.mark.parametrize("row", ROWS, ids=[row["code"] for row in ROWS])
def test_every_row_recognises_the_line_its_source_prints(row):
    found = classify(f"step 1200 loss 2.31\n{row['example']}\n")
    assert found is not None and found.code == row["code"]
    assert found.infrastructure is (row["kind"] == "infrastructure")
    if row["strength"] == "specific":
        assert found.detail == row["example"].strip()[:DETAIL_CHARS]


def test_the_table_is_well_formed():
    assert {row["kind"] for row in ROWS} == {"infrastructure", "application"}
    assert {row["strength"] for row in ROWS} <= {"specific", "generic"}
    assert len({row["code"] for row in ROWS}) == len(ROWS) == len(rules())
    assert all(row["source"] for row in ROWS)


def test_a_lost_infiniband_peer_is_the_infrastructures():
    found = classify(NCCL_IB_FAILURE)
    assert found is not None and found.infrastructure
    assert found.code in {"NCCL_REMOTE_ERROR", "IB_TRANSPORT_RETRY_EXCEEDED"}


def test_a_transport_error_outranks_the_traceback_it_raises():
    found = classify(TRACEBACK_OF_NCCL)
    assert found is not None and found.code == "NCCL_SYSTEM_ERROR" and found.infrastructure


def test_the_jobs_own_error_outranks_the_transport_errors_it_causes():
    found = classify(OOM_THEN_PEERS)
    assert found is not None and found.code == "CUDA_OUT_OF_MEMORY"
    assert not found.infrastructure


def test_a_bare_traceback_is_the_jobs_own():
    found = classify(KEY_ERROR)
    assert found is not None and not found.infrastructure and found.code == "PYTHON_TRACEBACK"
    assert found.detail == "KeyError: 'learning_rate'"  # the error, not the header


@pytest.mark.parametrize(
    "text",
    [
        "",
        "epoch 3 done",
        "CUDA error: unspecified launch failure",  # a bad kernel or a lost GPU: not by itself
        "NET/IB: Got completion from peer 10.0.0.2<1> with status=IBV_WC_LOC_PROT_ERR(4)",
        None,
        12,
        b"NCCL error: remote process exited or there was a network error",
    ],
)
def test_what_says_nothing_known_is_unknown(text):
    assert classify(text) is None


def test_only_the_tail_of_a_long_text_is_read():
    head = "NCCL error: remote process exited or there was a network error\n"
    assert classify(head + "x" * TAIL_CHARS) is None
    found = classify("y" * 1_000_000 + "\n" + head)
    assert found is not None and found.code == "NCCL_REMOTE_ERROR"


def test_the_detail_is_one_line_cut_short():
    found = classify("Connection reset by peer " + "z" * 1000 + "\nnext line")
    assert found is not None and "\n" not in found.detail
    assert len(found.detail) == DETAIL_CHARS

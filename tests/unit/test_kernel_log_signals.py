"""Kernel log signals that name no GPU by address (issue 28, item 1): GSP lines that use the
driver's own GPU number, link flaps logged by the network stack, a fatal PCIe error
reported by the bridge above a GPU. Lines are in the shapes their printing code gives
(kernel_gsp.c, mlx5e/ice/bnxt, drivers/pci/pcie/aer.c and setup-bus.c)."""

from __future__ import annotations

from gpuguard.checks.kernel_log.check import classify_log
from gpuguard.model import NODE, Action, Severity

XID119 = (
    "[171000.000001] NVRM: Xid (PCI:0000:db:00): 119, pid=2024380, name=python3, Timeout "
    "after 6s of waiting for RPC response from GPU6 GSP! Expected function 76 (GSP_RM_CONTROL) "
    "sequence 4242 (0x20802a02 0x8)."
)
RATE_LIMITED = (
    "[171000.100000] NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:db:00 "
    "(printing 1 of every 30).  The GPU likely needs to be reset."
)


def heartbeat(n: int, t: float) -> str:
    return f"[{t:.6f}] NVRM: GPU{n} _kgspRpcRecvPoll: GSP RM heartbeat timed out"


def test_gsp_heartbeat_lines_alone_still_ask_for_a_reset_and_name_the_gpu_number():
    log = "\n".join(heartbeat(6, 171100.0 + i) for i in range(5))
    (found,) = classify_log(log)
    assert (found.code, found.severity, found.action) == (
        "GSP_UNRESPONSIVE",
        Severity.CRITICAL,
        Action.RESET_GPU,
    )
    assert found.component == NODE  # no line ties GPU6 to an address: every GPU is reset
    assert "GPU6" in found.message


def test_a_gpu_number_an_xid_119_tied_to_an_address_names_that_gpu():
    other = "[171200.0] NVRM: GPU2 _kgspRpcRecvPoll: LibOS heartbeat timed out"
    log = "\n".join([XID119, RATE_LIMITED, heartbeat(6, 171100.0), other])
    by_code = {(f.code, f.component.id): f for f in classify_log(log)}
    # GPU6's lines repeat its Xid 119; GPU2's are their own finding, about the node.
    assert set(by_code) == {("XID_119", "0000:db:00.0"), ("GSP_UNRESPONSIVE", "node")}
    assert "GPU2" in by_code["GSP_UNRESPONSIVE", "node"].message


def test_the_gsp_sanity_check_line_names_its_gpu_by_number():
    line = (
        "NVRM: _kgspLogRpcSanityCheckFailure: GPU0 sanity check failed 0xf waiting for RPC "
        "response from GSP. Expected function 4097 (GSP_INIT_DONE) sequence 0 (0x0 0x0)."
    )
    (found,) = classify_log(line)
    assert found.code == "GSP_UNRESPONSIVE"
    assert "GPU0" in found.message


def test_a_slow_gsp_answer_is_not_a_fault():
    slow = (
        "[5.0] NVRM: GPU1 _kgspRpcRecvPoll: Slow RPC response from GPU1 GSP (1234us). "
        "Function 76 (GSP_RM_CONTROL) sequence 7 (0x0 0x0)."
    )
    assert classify_log(slow) == []

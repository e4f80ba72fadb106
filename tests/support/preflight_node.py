"""One node's ``gpuguard preflight`` on simulated GPUs, as a real process, for the
preflight and gang tests.

``python -m tests.support.preflight_node BACKEND ARGS...``: BACKEND is ``healthy``,
``corrupt`` (GPU 2, bus id 0000:12:00.0, flips a bit of every product), ``hang`` (matrix
products never return) or ``stall`` (the checks finish, then the command itself stalls:
only the hard deadline ends it); ARGS are gpuguard preflight's. ``GPUGUARD_TEST_GANG_DELAY_S``,
read only here, makes this gang member late by that many seconds before each all-reduce:
a node whose part arrives late.
"""

from __future__ import annotations

import os
import sys
import threading

from gpuguard.checks.load.checks import DeepGpuCheck
from gpuguard.checks.load.faults import CorruptingBackend, HangingBackend
from gpuguard.checks.load.nic_loopback import DeepNetworkCheck
from gpuguard.checks.load.numpy_backend import NumpyBackend
from gpuguard.cli import build_parser
from gpuguard.preflight import command
from tests.unit.test_load_checks import MODEL, healthy_speeds

DELAY_ENV = "GPUGUARD_TEST_GANG_DELAY_S"


def backend(kind: str) -> NumpyBackend:
    common = {"free_bytes": 1 << 20}
    if kind == "corrupt":
        return CorruptingBackend(4, MODEL, healthy_speeds(), bad_device=2, **common)
    if kind == "hang":
        return HangingBackend(2, MODEL, healthy_speeds(), **common)
    return NumpyBackend(4, MODEL, healthy_speeds(), **common)


def main() -> int:
    kind, argv = sys.argv[1], sys.argv[2:]
    if kind == "stall":
        command.local_result = lambda results: threading.Event().wait()  # type: ignore[assignment]
    args = build_parser().parse_args(["preflight", *argv])
    delay = float(os.environ.get(DELAY_ENV, "0"))
    hook = (lambda _: threading.Event().wait(delay)) if delay else None
    checks = [DeepGpuCheck(backend=backend(kind), nvml=None), DeepNetworkCheck()]
    return command.run_preflight(args, checks=checks, gang_hook=hook)


if __name__ == "__main__":
    sys.exit(main())

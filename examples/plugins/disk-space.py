#!/usr/bin/env python3
"""A gpuguard check plugin (JSON convention, docs/checks.md "Custom checks").

Free space of the file systems a GPU node cannot work without (container images, pod
logs, local checkpoints): below --warn-percent a warning, below --critical-percent a
critical finding. Prints {"findings": [...]} and exits 0; exits 2 on a bad argument.
"""

import argparse
import json
import os
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--warn-percent", type=float, default=10.0)
    parser.add_argument("--critical-percent", type=float, default=3.0)
    args = parser.parse_args()
    findings = []
    for path in args.paths:
        try:
            stats = os.statvfs(path)
        except OSError as exc:
            print(f"{path}: {exc.strerror}", file=sys.stderr)
            return 2
        free = 100.0 * stats.f_bavail / stats.f_blocks if stats.f_blocks else 0.0
        if free < args.critical_percent:
            code, severity = "DISK_FULL", "critical"
        elif free < args.warn_percent:
            code, severity = "DISK_LOW", "warning"
        else:
            continue
        findings.append(
            {"code": code, "severity": severity, "message": f"{path}: {free:.1f}% free"}
        )
    json.dump({"findings": findings}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Rebuild the example bundles in examples/ from the real captured outputs in tests/data.

Run from the repository root: ``.venv/bin/python hack/make_examples.py``. What each bundle
is made of, and the one edit made to real data, is written to examples/README.md by hand.
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
EXAMPLES = ROOT / "examples"

H100_CAPTURE = DATA / "nvidia-smi_capture_h100-80gb-hbm3_590.48.01_full.txt"
SYSFS_DUMP = DATA / "sysfs_class_infiniband_h100_flattened.txt"
XID79_LOG = DATA / "kmsg_xid79_fallen_off_bus_with_sxid20034.log"
CLEAN_BOOT_LOG = EXAMPLES / "clean-boot.log"


def idle_query_section() -> str:
    """The ``nvidia-smi -q`` output of the idle H100 capture."""
    lines = H100_CAPTURE.read_text().splitlines()
    start = lines.index("# $ nvidia-smi -q") + 2  # skip the command and the rule under it
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("####"))
    return "\n".join(lines[start:end]).strip("\n") + "\n"


def write_sysfs(target: Path, edits: dict[str, str] | None = None) -> None:
    """Expand the flattened sysfs dump ("path: value" per line) into a directory tree."""
    edits = edits or {}
    for line in SYSFS_DUMP.read_text().splitlines():
        if ": " not in line:
            continue
        relative, value = line.split(": ", 1)
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(edits.get(relative, value) + "\n")


def make_bundle(name: str, kernel_log: Path, sysfs_edits: dict[str, str] | None = None) -> None:
    bundle = EXAMPLES / name
    if bundle.exists():
        shutil.rmtree(bundle)
    bundle.mkdir(parents=True)
    (bundle / "nvidia-smi.txt").write_text(idle_query_section())
    shutil.copy(kernel_log, bundle / "kmsg.log")
    write_sysfs(bundle / "sysfs")


def main() -> None:
    make_bundle("healthy-h100", CLEAN_BOOT_LOG)
    make_bundle("xid79-fallen-off-bus", XID79_LOG)
    make_bundle("ib-link-half-rate", CLEAN_BOOT_LOG)
    write_sysfs(
        EXAMPLES / "ib-link-half-rate" / "sysfs",
        {"mlx5_7/ports/1/rate": "200 Gb/sec (4X HDR)"},
    )
    print(f"example bundles written under {EXAMPLES}")


if __name__ == "__main__":
    main()

"""Property tests: the RDMA parsers raise only ParseError, and no garbled input reads as a
healthy node."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuguard.checks.network.check import read_infiniband_sysfs
from gpuguard.checks.network.ibstat import IbstatPorts, parse_ibstat
from gpuguard.errors import ParseError
from tests.conftest import read_data
from tests.unit.ib_tree import h100_tree

FIXTURES = {
    name: read_data(name)
    for name in (
        "ibstat_h100_all_active.txt",
        "ibstat_h100_some_ports_down.txt",
        "ibstat_a100_ibpanic_exit255.txt",
        "ibstatus_a100_all_active.txt",
    )
}
fixture_names = st.sampled_from(sorted(FIXTURES))

# Bits of the real format, so that random documents get past the first line sometimes.
TOKENS = (
    "CA 'mlx5_0'\n",
    "\tCA type: MT4129\n",
    "\tNumber of ports: 1\n",
    "\tNumber of ports: 2\n",
    "\tPort 1:\n",
    "\tPort 2:\n",
    "\t\tState: Active\n",
    "\t\tState: Down\n",
    "\t\tPhysical state: LinkUp\n",
    "\t\tRate: 400\n",
    "\t\tRate: x\n",
    "\t\tLink layer: InfiniBand\n",
    "ibpanic: stat of IB device 'mlx5_9' failed\n",
    "\n",
    ":",
)


def parse_or_none(text: str) -> IbstatPorts | None:
    """The parse result, or None for a ParseError; any other exception fails the test."""
    try:
        return parse_ibstat(text)
    except ParseError:
        return None


def assert_not_silently_empty(ports: IbstatPorts | None) -> None:
    if ports is not None:
        assert len(ports) > 0 or ports.panic is not None
        for port in ports:
            assert port.device and port.port >= 0 and port.state and port.phys_state
            assert port.rate_gbps is not None and port.rate_gbps >= 0


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_arbitrary_text(text: str) -> None:
    assert_not_silently_empty(parse_or_none(text))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(TOKENS) | st.text(max_size=12), max_size=30))
def test_documents_made_of_format_pieces(pieces: list[str]) -> None:
    assert_not_silently_empty(parse_or_none("".join(pieces)))


@settings(max_examples=200, deadline=None)
@given(fixture_names, st.data())
def test_truncated_fixture_never_looks_better_than_the_whole(
    name: str, data: st.DataObject
) -> None:
    text = FIXTURES[name]
    cut = data.draw(st.integers(min_value=0, max_value=len(text)))
    ports = parse_or_none(text[:cut])
    assert_not_silently_empty(ports)
    whole = {port.name: port for port in parse_or_none(text) or []}
    for port in ports or []:
        original = whole[port.name]
        assert original.link_up or not port.link_up
        assert port.rate_gbps is not None and original.rate_gbps is not None
        assert port.rate_gbps <= original.rate_gbps


@settings(max_examples=200, deadline=None)
@given(fixture_names, st.data())
def test_mutated_fixture(name: str, data: st.DataObject) -> None:
    lines = FIXTURES[name].splitlines(keepends=True)
    for _ in range(data.draw(st.integers(min_value=1, max_value=5))):
        index = data.draw(st.integers(min_value=0, max_value=len(lines) - 1))
        edit = data.draw(st.sampled_from(["drop", "duplicate", "replace", "garble"]))
        if edit == "drop":
            del lines[index]
        elif edit == "duplicate":
            lines.insert(index, lines[index])
        elif edit == "replace":
            lines[index] = data.draw(st.text(max_size=40)) + "\n"
        else:
            line = lines[index]
            at = data.draw(st.integers(min_value=0, max_value=len(line)))
            lines[index] = line[:at] + data.draw(st.text(max_size=3)) + line[at + 1 :]
        if not lines:
            break
    assert_not_silently_empty(parse_or_none("".join(lines)))


SYSFS_FILES = (
    "mlx5_0/ports/1/state",
    "mlx5_0/ports/1/phys_state",
    "mlx5_0/ports/1/rate",
    "mlx5_0/ports/1/link_layer",
    "mlx5_0/ports/1/counters/symbol_error",
    "mlx5_7/hca_type",
)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SYSFS_FILES), st.binary(max_size=40))
def test_sysfs_file_with_any_content(relative: str, content: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = h100_tree(Path(tmp))
        (root / relative).write_bytes(content)
        try:
            ports = read_infiniband_sysfs(root)
        except ParseError:
            return
        assert len(ports) == 3
        port = ports[0]
        if relative.endswith("/state") and port.link_up:
            assert content.strip().endswith(b": ACTIVE")

"""Property tests: the nvidia-smi parsers return GPUs or raise ParseError, nothing else.

Truncated real reports are the failure that matters: nvidia-smi killed by a timeout, or a
bundle copied half-way. A truncated text report must never pass for a complete one.
"""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuguard.checks.gpu_facts import GpuFacts
from gpuguard.checks.nvidia_smi.check import parse_smi_text, parse_smi_xml
from gpuguard.errors import ParseError

DATA = Path(__file__).parent.parent / "data"

TEXT_FIXTURES = [
    (DATA / name).read_text()
    for name in (
        "nvidia-smi-q_a10_535.129.03_row_remap_pending.txt",
        "nvidia-smi-q_h100x8_535.161.08_hw_slowdown_active.txt",
        "nvidia-smi-q_h100_535.183.01_truncated_invalid.txt",
    )
]
XML_FIXTURES = [path.read_text() for path in sorted(DATA.glob("nvidia-smi-q-x_*.xml"))]
COMPLETE_TEXT = TEXT_FIXTURES[:2]

# Pieces of real reports, so that random documents get past the first line now and then.
TOKENS = [
    "Attached GPUs : 1\n",
    "Attached GPUs : 2\n",
    "GPU 00000000:07:00.0\n",
    "GPU 00000000:08:00.0\n",
    "    Processes : None\n",
    "    Remapped Rows\n",
    "        Pending : Yes\n",
    "    Temperature\n",
    "        GPU Current Temp : 99 C\n",
    "Unable to determine the device handle for GPU0000:91:00.0: Unknown Error\n",
    "<nvidia_smi_log>",
    "</nvidia_smi_log>",
    "<attached_gpus>1</attached_gpus>",
    '<gpu id="00000000:01:00.0">',
    "</gpu>",
    "<remapped_rows>N/A</remapped_rows>",
    '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">',
    '<!ENTITY a "b">',
    "&a;",
    "N/A",
    "\t",
    " : ",
]

PARSERS = [parse_smi_text, parse_smi_xml]

_PROCESSES_LINE = re.compile(r"^    Processes(?:\s|$)", re.MULTILINE)


def parse_or_none(text: str, parser_index: int) -> list[GpuFacts] | None:
    """The parser's GPUs, or None for ParseError; any other exception fails the test."""
    try:
        result = PARSERS[parser_index](text)
    except ParseError:
        return None
    assert isinstance(result, list)
    assert all(isinstance(gpu, GpuFacts) for gpu in result)
    assert result, "a parser must not return an empty list"
    return result


@settings(max_examples=200, deadline=None)
@given(text=st.text(), parser_index=st.sampled_from([0, 1]))
def test_arbitrary_text(text: str, parser_index: int) -> None:
    parse_or_none(text, parser_index)


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(st.sampled_from(TOKENS) | st.text(max_size=20), max_size=30))
def test_report_like_text(pieces: list[str]) -> None:
    text = "".join(pieces)
    for parser_index in (0, 1):
        parse_or_none(text, parser_index)


@st.composite
def mutated(draw: st.DrawFn, documents: list[str]) -> str:
    """A real report with a few lines deleted, duplicated, replaced or spliced."""
    lines = draw(st.sampled_from(documents)).splitlines()
    for _ in range(draw(st.integers(1, 4))):
        if not lines:
            break
        at = draw(st.integers(0, len(lines) - 1))
        edit = draw(st.sampled_from(["delete", "duplicate", "replace", "cut"]))
        if edit == "delete":
            del lines[at]
        elif edit == "duplicate":
            lines.insert(at, lines[at])
        elif edit == "replace":
            lines[at] = draw(st.sampled_from(TOKENS) | st.text(max_size=40))
        else:
            lines[at] = lines[at][: draw(st.integers(0, len(lines[at])))]
    return "\n".join(lines)


@settings(max_examples=200, deadline=None)
@given(text=mutated(TEXT_FIXTURES + XML_FIXTURES), parser_index=st.sampled_from([0, 1]))
def test_mutated_reports(text: str, parser_index: int) -> None:
    parse_or_none(text, parser_index)


@settings(max_examples=200, deadline=None)
@given(document=st.sampled_from(TEXT_FIXTURES), data=st.data())
def test_truncated_text_never_passes_for_complete(document: str, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(document)))
    prefix = document[:cut]
    gpus = parse_or_none(prefix, 0)
    if gpus is None:
        return
    # Returned GPUs are exactly the complete sections, and the report announced no more.
    complete_sections = len(_PROCESSES_LINE.findall(prefix))
    assert len(gpus) == complete_sections
    assert document in COMPLETE_TEXT
    assert len(gpus) == len(parse_smi_text(document))


@settings(max_examples=200, deadline=None)
@given(document=st.sampled_from(XML_FIXTURES), data=st.data())
def test_truncated_xml_report_is_refused(document: str, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(document)))
    prefix = document[:cut]
    gpus = parse_or_none(prefix, 1)
    if gpus is not None:
        # Only a cut in the trailing whitespace leaves a well-formed document.
        assert prefix.rstrip().endswith("</nvidia_smi_log>")
        assert gpus == parse_smi_xml(document)

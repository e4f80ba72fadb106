"""Property-based fuzzing of the kernel log scanner: it reads any text, and gives findings
on the ladder or, for text with no kernel record and no line it reads, a ParseError (never
a quiet healthy); whatever Xid line it is fed, the verdict names the GPU."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuguard.errors import ParseError
from gpuguard.kernel_log.check import RepeatScanner, classify_log, has_kernel_record, scan
from gpuguard.model import Action, Finding, Severity
from tests.conftest import DATA

REAL_LOGS = [path.read_text() for path in sorted(DATA.glob("*.log"))]
hexbyte = st.integers(0, 255).map(lambda n: f"{n:02x}")


def _read(text: str) -> list[Finding] | None:
    """The findings, or None where the text is no kernel log (and so says the scanner)."""
    try:
        return classify_log(text)
    except ParseError:
        assert not scan(text) and not has_kernel_record(text)
        return None


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_is_read_or_refused_as_no_kernel_log(text):
    findings = _read(text)
    if findings is None:
        return
    assert scan(text) or has_kernel_record(text)  # healthy only when it is a kernel log
    for finding in findings:
        assert finding.action in Action
        assert finding.severity in Severity


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(REAL_LOGS), st.integers(0, 10_000), st.integers(0, 10_000), st.text(max_size=40)
)
def test_mutated_real_logs_never_raise(log, cut, insert_at, noise):
    mutated = log[: insert_at % (len(log) + 1)] + noise + log[insert_at % (len(log) + 1) :]
    _read(mutated[: cut % (len(mutated) + 1)])


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 0xFFFF),
    hexbyte,
    hexbyte,
    st.integers(0, 100_000),
    st.text(alphabet=st.characters(blacklist_characters="\n\r"), max_size=60),
)
def test_any_xid_line_gives_one_finding_for_its_gpu(domain, bus, device, code, text):
    line = f"[  12.000001] NVRM: Xid (PCI:{domain:04x}:{bus}:{device}): {code}, {text}"
    findings = classify_log(line)
    assert len(findings) == 1
    (finding,) = findings
    assert finding.component.id == f"{domain:04x}:{bus}:{device}.0"
    if code not in (45, 154):
        assert finding.code == f"XID_{code}"


STAMPS = st.sampled_from(
    [
        "",
        "[ 5.123456] ",
        "[6781741.548779] ",
        "6,1234,5678901,-;",
        "4,77,12,c;",
        "2026-12-01T08:00:00+0000 host kernel: ",
        "2026-12-01T08:00:00.123456Z ",
    ]
)
MESSAGES = st.sampled_from([line for log in REAL_LOGS for line in log.splitlines()][:4000])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(STAMPS, st.one_of(MESSAGES, st.text(max_size=80)), st.integers(1, 3)),
        max_size=30,
    )
)
def test_repeats_parsed_once_read_as_every_line_parsed(lines):
    # RepeatScanner parses a message seen before (time stamp aside) from its cache: the
    # events must be those of parsing every line, all but the line each came from.
    log = "".join(
        f"{stamp}{message}\n".replace("\r", "") * times for stamp, message, times in lines
    ).encode("utf-8", errors="surrogatepass")
    scanner = RepeatScanner()
    cached = [replace(e, line="") for e in scanner.events(log) + scanner.events(log)]
    parsed = [replace(e, line="") for e in scan(log) + scan(log)]
    assert cached == parsed

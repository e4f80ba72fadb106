"""Reads what a plugin said: its exit status, or the JSON findings document it printed.

Pure: text and exit status in, findings out. Anything outside the contract (docs/checks.md,
"Custom checks") raises :class:`ParseError` or :class:`CheckFailed`, which the runner
reports as the check's Unknown verdict, never as a healthy one.
"""

from __future__ import annotations

import json

from gpuguard.errors import CheckFailed, ParseError
from gpuguard.model import NODE, Action, Component, Finding, Severity, gpu, is_pci_bus_id, nic
from gpuguard.plugins_config import CODE_PATTERN, PluginConfig

MAX_FINDINGS = 100
MAX_MESSAGE_CHARS = 500
EVIDENCE_CHARS = 2000
_SEVERITIES = {str(s): s for s in Severity}


def read_exit_code(settings: PluginConfig, exit_code: int, stdout: str) -> list[Finding]:
    """node-problem-detector's convention: 0 OK, 1 a problem (stdout says what), else Unknown."""
    if exit_code == 0:
        return []
    first_line = _first_line(stdout)
    if exit_code != 1:
        raise CheckFailed(_exit_detail(exit_code, first_line))
    code = settings.exit_problem_code
    own = Severity[settings.problem_severity.upper()]
    message = first_line[:MAX_MESSAGE_CHARS] or "exit status 1"
    return [_finding(settings, code, own, NODE, message, stdout[:EVIDENCE_CHARS])]


def read_json(settings: PluginConfig, exit_code: int, stdout: str) -> list[Finding]:
    """``{"findings": [{"code", "severity", "message", "gpu"|"nic"?}, ...]}``; exit 0 or 1."""
    if exit_code not in (0, 1):
        raise CheckFailed(_exit_detail(exit_code, _first_line(stdout)))
    try:
        document = json.loads(stdout)
    except json.JSONDecodeError as exc:
        raise ParseError(f"not a JSON document ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:  # nested deeper than the parser goes: garbage all the same
        raise ParseError("not a JSON document (nested too deep)") from None
    if not isinstance(document, dict) or not isinstance(document.get("findings"), list):
        raise ParseError('no "findings" list at the top of the document')
    items = document["findings"]
    if len(items) > MAX_FINDINGS:
        raise ParseError(f"{len(items)} findings: at most {MAX_FINDINGS}")
    return [_from_item(settings, index, item) for index, item in enumerate(items)]


def _from_item(settings: PluginConfig, index: int, item: object) -> Finding:
    where = f"findings[{index}]"
    if not isinstance(item, dict):
        raise ParseError(f"{where}: not an object")
    code, severity, message = item.get("code"), item.get("severity"), item.get("message", "")
    if not isinstance(code, str) or not CODE_PATTERN.match(code):
        raise ParseError(f"{where}.code: {code!r} is not upper-case letters, digits and _")
    if not isinstance(severity, str) or severity not in _SEVERITIES:
        raise ParseError(f"{where}.severity: {severity!r} is not info, warning or critical")
    if not isinstance(message, str):
        raise ParseError(f"{where}.message: not a string")
    component = _component(where, item)
    evidence = json.dumps(item)[:EVIDENCE_CHARS]
    own = _SEVERITIES[str(severity)]
    return _finding(settings, code, own, component, message[:MAX_MESSAGE_CHARS], evidence)


def _component(where: str, item: dict[str, object]) -> Component:
    """The part named by ``gpu`` (a PCI bus id) or ``nic`` (``mlx5_0/1``); else the node."""
    for key, make in (("gpu", gpu), ("nic", nic)):
        value = item.get(key)
        if value is None:
            continue
        if not isinstance(value, str) or not value.strip():
            raise ParseError(f"{where}.{key}: not a non-empty string")
        # A GPU the node does not have would take the quarantine while the faulty one works on.
        if key == "gpu" and not is_pci_bus_id(value):
            raise ParseError(f"{where}.gpu: {value[:80]!r} is not a PCI bus id (0000:19:00.0)")
        return make(value)
    return NODE


def _finding(
    settings: PluginConfig,
    code: str,
    own: Severity,
    component: Component,
    message: str,
    evidence: str,
) -> Finding:
    """The operator's mapping of ``code`` decides severity and action, else the plugin's
    severity and no repair."""
    mapped = settings.codes.get(code)
    return Finding(
        layer=settings.layer,
        code=code,
        severity=mapped.as_severity if mapped else own,
        action=mapped.as_action if mapped else Action.NONE,
        component=component,
        source=settings.check_name,
        message=message,
        evidence=evidence,
    )


def _first_line(stdout: str) -> str:
    return next((line.strip() for line in stdout.splitlines() if line.strip()), "")


def _exit_detail(exit_code: int, first_line: str) -> str:
    said = f": {first_line[:200]}" if first_line else ""
    return f"exit status {exit_code} (neither OK nor a problem: Unknown){said}"

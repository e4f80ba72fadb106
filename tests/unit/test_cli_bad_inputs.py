"""Every file a subcommand takes, given something that is not one: random bytes, a file too
large, a directory, a missing path, a path below a plain file, text of the wrong shape.
The answer is exit status 64 (EX_USAGE, as for any usage error) and one line
``gpuguard: ...`` naming the file, never a traceback (issue 29)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuguard.cli import main
from gpuguard.files import MAX_INPUT_BYTES

# Each subcommand's file arguments; FILE is replaced by the bad input's path.
COMMANDS = [
    ["check", "--config", "FILE"],
    ["check", "--bundle", "FILE"],
    ["agent", "--config", "FILE", "--print-conditions"],
    ["bundle", "collect", "FILE/bundle"],
    ["simulate", "--scenario", "FILE", "--no-progress"],
    ["simulate", "--policy-file", "FILE", "--no-progress"],
    ["simulate", "--trace", "FILE", "--no-progress"],
    ["controller", "--policy", "FILE", "--metrics-port", "0"],
    ["controller", "--kubeconfig", "FILE", "--metrics-port", "0"],
    ["cleanup", "--kubeconfig", "FILE"],
]


def _random_bytes(path: Path, data: bytes) -> None:
    path.write_bytes(b"\xff" + data)  # never valid UTF-8


def _huge(path: Path, _: bytes) -> None:
    with path.open("wb") as handle:  # sparse: quick to make, 64 MiB of NULs to read
        handle.truncate(MAX_INPUT_BYTES + 1)


def _directory(path: Path, _: bytes) -> None:
    path.mkdir()


def _missing(path: Path, _: bytes) -> None:
    pass


def _wrong_shape(path: Path, data: bytes) -> None:
    # Valid text that is no mapping: a YAML list, or a line YAML cannot parse.
    words = data.decode("ascii", errors="ignore").replace("\n", " ")[:200]
    path.write_text(f"- {words!r}\n" if len(data) % 2 else f"key: [{words!r}\n")


KINDS: dict[str, Callable[[Path, bytes], None]] = {
    "random bytes": _random_bytes,
    "too large": _huge,
    "a directory": _directory,
    "missing": _missing,
    "wrong shape": _wrong_shape,
}


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c))
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(kind=st.sampled_from(sorted(KINDS)), data=st.binary(max_size=2048))
def test_a_bad_file_gets_one_line_naming_it(command, kind, data, tmp_path, capsys):
    path = tmp_path / f"input-{os.urandom(4).hex()}"
    KINDS[kind](path, data)
    argv = [arg.replace("FILE", str(path)) for arg in command]
    if command[:2] == ["bundle", "collect"] and kind in ("a directory", "missing"):
        return  # a bundle goes into a directory, new or not: nothing bad to report
    code, err = run(argv, capsys)
    assert "Traceback" not in err, err[-2000:]
    assert code == 64, (kind, argv, err[-2000:])
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("gpuguard: ") and str(path) in err, err


def test_a_kubeconfig_that_is_no_file_is_named(tmp_path, capsys):
    code, err = run(["cleanup", "--kubeconfig", str(tmp_path / "nope")], capsys)
    assert code == 64 and str(tmp_path / "nope") in err and len(err.strip().splitlines()) == 1


def test_without_the_flag_credentials_are_found_as_kubectl_finds_them(tmp_path, monkeypatch):
    from gpuguard.kube.rest import default_kubeconfig

    home, first, second = tmp_path / "home", tmp_path / "a.yaml", tmp_path / "b.yaml"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{first}:{second}")
    second.write_text("apiVersion: v1\n")
    assert default_kubeconfig() == second  # the first of $KUBECONFIG that exists
    first.write_text("apiVersion: v1\n")
    assert default_kubeconfig() == first
    monkeypatch.delenv("KUBECONFIG")
    assert default_kubeconfig() is None  # no ~/.kube/config: the pod's service account
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text("apiVersion: v1\n")
    assert default_kubeconfig() == home / ".kube" / "config"


def test_a_bad_kubeconfig_from_the_environment_is_named(tmp_path, monkeypatch, capsys):
    broken = tmp_path / "kubeconfig"
    broken.write_bytes(b"\xff\x00garbage")
    monkeypatch.setenv("KUBECONFIG", str(broken))
    code, err = run(["cleanup"], capsys)
    assert code == 64 and str(broken) in err and len(err.strip().splitlines()) == 1

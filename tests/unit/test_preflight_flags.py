"""``gpuguard controller``'s preflight flags: off by default, bad values one line each."""

from __future__ import annotations

import pytest

from gpuguard.cli import EXIT_USAGE, build_parser, main


def parse(*flags: str):
    return build_parser().parse_args(["controller", *flags])


def test_the_webhook_is_off_by_default():
    args = parse()
    assert args.webhook_port == 0
    assert (args.webhook_secret, args.webhook_config, args.webhook_service) == (
        "gpuguard-webhook-tls",
        "gpuguard-preflight",
        "gpuguard-controller-webhook",
    )
    assert args.preflight_budget == 60.0 and args.webhook_ip == []


def test_flags_are_read():
    args = parse(
        "--webhook-port", "9443", "--webhook-ip", "127.0.0.1", "--webhook-ip", "::1",
        "--preflight-image", "r/gpuguard:1", "--preflight-budget", "45.5",
    )  # fmt: skip
    assert (args.webhook_port, args.webhook_ip) == (9443, ["127.0.0.1", "::1"])
    assert (args.preflight_image, args.preflight_budget) == ("r/gpuguard:1", 45.5)


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (("--webhook-ip", "localhost"), "not an IP address: 'localhost'"),
        (("--preflight-budget", "0"), "must be more than 0"),
        (("--preflight-budget", "soon"), "not a number of seconds"),
    ],
)
def test_bad_values_are_refused_in_one_line(flags, complaint, capsys):
    with pytest.raises(SystemExit):
        parse(*flags)
    assert complaint in capsys.readouterr().err


def test_the_webhook_needs_the_init_containers_image(capsys, monkeypatch):
    monkeypatch.delenv("GPUGUARD_PREFLIGHT_IMAGE", raising=False)
    assert main(["controller", "--webhook-port", "9443", "--metrics-port", "0"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err == "gpuguard: --webhook-port needs --preflight-image (the init container's image)\n"

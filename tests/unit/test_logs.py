"""gpuguard.logs: JSON lines carry the process's fields and the node and episode a call names."""

from __future__ import annotations

import json
import logging

from gpuguard.logs import JsonFormatter, about


def _line(record: logging.LogRecord, **fields: str) -> dict[str, object]:
    return dict(json.loads(JsonFormatter(fields).format(record)))


def _record(message: str, *args: object, **extra: str) -> logging.LogRecord:
    record = logging.LogRecord(
        "gpuguard.controller", logging.INFO, __file__, 1, message, args, None
    )
    record.__dict__.update(extra)
    return record


def test_a_json_line_has_the_message_and_the_fields_of_the_call() -> None:
    line = _line(_record("Taint %s: %s", "gpu-1", "unhealthy", **about("gpu-1", "gpu-1-17")))
    assert line["message"] == "Taint gpu-1: unhealthy"
    assert (line["level"], line["logger"]) == ("INFO", "gpuguard.controller")
    assert (line["node"], line["episode"]) == ("gpu-1", "gpu-1-17")
    assert str(line["time"]).endswith("+00:00")


def test_the_process_fields_go_into_every_line_and_a_call_without_episode_has_none() -> None:
    line = _line(_record("publishing"), node="gpu-2")
    assert line["node"] == "gpu-2"
    assert "episode" not in line

"""Log output of the long-running commands (agent, controller): text, or one JSON object
a line for log pipelines (``--log-format json``, or ``GPUGUARD_LOG_FORMAT=json``).

A JSON line carries ``time``, ``level``, ``logger`` and ``message``, the process's own
fields (the agent's ``node``), and the ``node`` and ``episode`` a call passes with
``extra=`` (see :func:`about`), so one node's or one episode's lines can be selected.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys
from collections.abc import Mapping

FORMATS = ("text", "json")
FORMAT_ENV = "GPUGUARD_LOG_FORMAT"
FIELDS = ("node", "episode")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default=os.environ.get(FORMAT_ENV, "text"),
        help=f"text lines, or JSON lines (default: ${FORMAT_ENV}, else text)",
    )


def about(node: str, episode: str | None = None) -> dict[str, str]:
    """The ``extra=`` of a line about ``node`` (and its ``episode``, a NodeRemediation)."""
    return {"node": node} if episode is None else {"node": node, "episode": episode}


class JsonFormatter(logging.Formatter):
    def __init__(self, fields: Mapping[str, str]) -> None:
        super().__init__()
        self.fields = dict(fields)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **self.fields,
        }
        for key in FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(log_format: str, **fields: str) -> None:
    """INFO and up to stderr; ``fields`` go into every JSON line."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = JsonFormatter(fields) if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    logging.basicConfig(level=logging.INFO, handlers=[handler])

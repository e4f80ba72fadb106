"""The controller's watches: each resource listed, then watched, on its own thread, every
item handed to the controller's fold for it. An item that cannot be read is counted and
skipped (it never ends the watch); a broken watch resumes from the last version seen."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gpuguard import threads
from gpuguard.controller.metrics import ControllerMetrics
from gpuguard.kube.rest import Json, KubeApi, WatchEvent
from gpuguard.kube.watch import Snapshot, keep_watching, list_then_watch

log = logging.getLogger("gpuguard.controller")
Fold = Callable[[Snapshot | WatchEvent], str]  # takes an item, gives its resourceVersion


@dataclass(frozen=True)
class Watched:
    what: str  # the thread's name: watch-<what>
    path: str
    take: Fold
    project: Callable[[Json], Json] | None = None  # shrinks each object as it arrives
    decode: Callable[[bytes], Json] | None = None  # decodes list pages already shrunk
    decode_object: Callable[[bytes], Json] | None = None  # decodes watched objects so


def start(
    api: KubeApi,
    watched: list[Watched],
    stop: threading.Event,
    metrics: ControllerMetrics,
    retry_s: float,
) -> list[threading.Thread]:
    return [
        threads.start(
            f"watch-{one.what}",
            functools.partial(follow, api, one, metrics=metrics, retry_s=retry_s),
            stop,
        )
        for one in watched
    ]


def follow(
    api: KubeApi,
    watched: Watched,
    stop: threading.Event,
    *,
    metrics: ControllerMetrics,
    retry_s: float,
) -> None:
    version = ""

    def stream() -> Iterator[Snapshot | WatchEvent]:
        return list_then_watch(
            api,
            watched.path,
            project=watched.project,
            decode_page=watched.decode,
            decode_object=watched.decode_object,
            resource_version=version,
            stop=stop,
        )

    def fold(item: Snapshot | WatchEvent) -> None:
        nonlocal version
        try:
            version = watched.take(item) or version
        except Exception:  # one object gpuguard cannot read must not end the watch
            metrics.unreadable.labels(watched.path).inc()
            log.exception("%s: a watch item could not be read, skipped", watched.path)

    keep_watching(stream, fold, stop, log=log, what=watched.path, retry_s=retry_s)

"""List, then follow changes: the controller's view of a kind without polling.

A watch resumes from the last resourceVersion it saw (bookmarks keep that version fresh on
quiet kinds, so a restart does not fall off etcd's compaction window). When the version is
gone anyway (410), the only correct move is a new list: the caller gets a
:class:`Snapshot` and replaces what it knew, instead of silently missing deletions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from gpuguard.kube.errors import KubeError, KubeRejected, KubeUnavailable
from gpuguard.kube.rest import WATCH_TIMEOUT_S, Json, KubeApi, KubeExpired, Listing, WatchEvent
from gpuguard.retry import Backoff

RETRY_S = 2.0  # before resuming a broken watch
REFUSED_RETRY_MAX_S = 300.0
WATCH_JOIN_S = 5.0  # a watch ended by end_watches leaves its read at once

T = TypeVar("T")


@dataclass(frozen=True)
class Snapshot:
    """Every object as of ``resource_version``: forget what was known, keep these."""

    items: list[Json]
    resource_version: str


def list_then_watch(
    api: KubeApi,
    path: str,
    *,
    label_selector: str = "",
    field_selector: str = "",
    project: Callable[[Json], Json] | None = None,
    decode_page: Callable[[bytes], Json] | None = None,
    decode_object: Callable[[bytes], Json] | None = None,
    resource_version: str = "",
    stop: threading.Event | None = None,
    watch_timeout_s: int = WATCH_TIMEOUT_S,
) -> Iterator[Snapshot | WatchEvent]:
    """A :class:`Snapshot`, then ADDED/MODIFIED/DELETED events, relisting after a 410.

    Starts with a list unless ``resource_version`` is given (resuming a watch whose
    connection broke: :class:`~gpuguard.kube.errors.KubeUnavailable` ends the iterator and
    the caller may call again with the last version it saw). ``stop`` is checked between
    events and between watch requests, which the server ends every ``watch_timeout_s``; to
    stop at once, set ``stop`` and call ``api.end_watches(stop)`` (or close ``api``): the
    broken read then ends quietly. ``decode_page`` and ``decode_object`` decode the list's
    pages and the watch's objects into their projected shape at once; ``project`` shrinks
    what they do not decode."""
    shrink = None if decode_object else project
    stopped = (stop or threading.Event()).is_set

    version = resource_version

    def relist() -> Snapshot:
        """Yielded, never kept: the watch would hold every object since replaced."""
        nonlocal version
        listing = _list(api, path, label_selector, field_selector, project, decode_page)
        version = listing.resource_version
        return Snapshot(listing.items, version)

    if not version:
        yield relist()
    while not stopped():
        try:
            for event in api.watch(
                path,
                resource_version=version,
                label_selector=label_selector,
                field_selector=field_selector,
                timeout_s=watch_timeout_s,
                stop=stop,
                decode_object=decode_object,
            ):
                version = event.resource_version or version
                if event.type != "BOOKMARK":
                    yield WatchEvent(event.type, shrink(event.object)) if shrink else event
                if stopped():
                    return
        except KubeExpired:
            yield relist()
        except KubeUnavailable:
            if stopped():
                return  # the caller ended the blocked read on purpose
            raise


def _list(
    api: KubeApi,
    path: str,
    label_selector: str,
    field_selector: str,
    project: Callable[[Json], Json] | None,
    decode_page: Callable[[bytes], Json] | None,
) -> Listing:
    """A list whose items come out projected: decoded so by ``decode_page``, if given."""
    return api.list(
        path,
        label_selector=label_selector,
        field_selector=field_selector,
        project=None if decode_page else project,
        decode_page=decode_page,
    )


def keep_watching(
    stream: Callable[[], Iterable[T]],
    take: Callable[[T], object],
    stop: threading.Event,
    *,
    log: logging.Logger,
    what: str,
    when_refused: str = "retrying with backoff",
    retry_s: float = RETRY_S,
) -> None:
    """Feed every item of ``stream()`` to ``take``, opening the stream again when it
    breaks, until ``stop``. A broken connection is resumed after ``retry_s``. A refusal
    (RBAC missing from an older chart, say) is not granted by retrying every few seconds:
    it backs off, doubling to 5 minutes, and is said once per streak of refusals."""
    refusals = Backoff(retry_s * 2, REFUSED_RETRY_MAX_S)
    while not stop.is_set():
        try:
            for item in stream():
                take(item)
                refusals.reset()
        except KubeRejected as exc:
            if not refusals.failures:
                log.warning("cannot watch %s (refused), %s: %s", what, when_refused, exc)
            refusals.wait(stop)
        except KubeError as exc:
            refusals.reset()
            log.warning("watch of %s broken, resuming: %s", what, exc)
            stop.wait(retry_s)

"""RMA evidence on request: the node's bundle, its findings, packed and stored.

A request is the Node's ``gpuguard.io/collect-evidence`` annotation (any id: the
controller's before a replacement, or a person's). Once per id the agent captures what
``gpuguard bundle collect`` collects (a bundle-backed agent copies its bundle), adds its
current report and the Node's report and kernel-memory annotations, packs it as
``<node>-<time>.tar.gz`` in ``evidence.directory`` (or in a temporary directory, then put in
the ``evidence.s3`` bucket), answers in ``gpuguard.io/evidence`` and records an Event naming
the file. Capture runs on its own thread: it may take minutes.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from gpuguard import bundle
from gpuguard.clock import Clock
from gpuguard.config import Config
from gpuguard.contract.evidence import EvidenceAnswer, read_answer, write_answer
from gpuguard.contract.keys import (
    AGENT_CONTROLLER,
    EVIDENCE_ANNOTATION,
    EVIDENCE_REQUEST_ANNOTATION,
    MEMORY_ANNOTATION,
    REPORT_ANNOTATION,
)
from gpuguard.contract.times import format_time
from gpuguard.errors import ConfigError
from gpuguard.evidence import SUFFIX, pack
from gpuguard.kube.errors import KubeError
from gpuguard.model import NodeReport
from gpuguard.s3_store import StoreError, put_file
from gpuguard.sources import BundleSources, Sources

if TYPE_CHECKING:
    from gpuguard.kube.client import NodeApi

SCRATCH_PREFIX = "gpuguard-evidence-"
log = logging.getLogger("gpuguard.agent")
COLLECTED = "EvidenceCollected"


def capture(
    config: Config,
    sources: Sources,
    node: str,
    at: float,
    history: Mapping[str, str],
    store: Path | None = None,
) -> Path:
    """Capture and store the node's evidence (in ``store``, else the evidence directory);
    returns the archive's path."""
    assert config.evidence is not None
    store = store or config.evidence.directory
    assert store is not None
    try:
        store.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"evidence.directory {store}: {exc.strerror}") from None
    stamp = format_time(float(int(at))).replace(":", "")  # whole seconds: a plain name
    target = store / f"{node}-{stamp}{SUFFIX}"
    with tempfile.TemporaryDirectory(dir=store, prefix=".capture-") as scratch:
        root = Path(scratch) / "bundle"
        if isinstance(sources, BundleSources):
            shutil.copytree(sources.root, root)
            manifest = {"bundle": f"copied from {sources.root}"}
        else:
            manifest = bundle.collect(root, config)
        for name, text in history.items():
            (root / name).write_text(text)
        manifest.update({name: "the agent's finding history" for name in history})
        manifest.update({"node": node, "capturedAt": format_time(at)})
        (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        pack(root, target)
    return target


class EvidenceRequests:
    """Answers each evidence request on the Node once, on a thread of its own."""

    def __init__(
        self,
        api: NodeApi,
        node: str,
        config: Config,
        sources: Sources,
        report: Callable[[], NodeReport | None],
        clock: Clock,
    ) -> None:
        self._api, self._node, self._config, self._sources = api, node, config, sources
        self._report, self._clock = report, clock
        self._taken: set[str] = set()
        self._lock = threading.Lock()

    def take_annotations(self, annotations: Mapping[str, str]) -> None:
        request = annotations.get(EVIDENCE_REQUEST_ANNOTATION)
        answered = read_answer(annotations.get(EVIDENCE_ANNOTATION))
        if not request or (answered is not None and answered.request == request):
            return
        with self._lock:
            if request in self._taken:
                return
            self._taken.add(request)
        history = {
            "node-report.json": annotations.get(REPORT_ANNOTATION, ""),
            "node-kernel-findings.json": annotations.get(MEMORY_ANNOTATION, ""),
        }
        worker = threading.Thread(
            target=self._answer, args=(request, history), name="evidence", daemon=True
        )
        worker.start()

    def _answer(self, request: str, history: dict[str, str]) -> None:
        report = self._report()
        if report is not None:
            history["agent-report.json"] = json.dumps(report.to_dict(), indent=2) + "\n"
        try:
            location, note = self._store(history)
        except (ConfigError, OSError, StoreError) as exc:
            location, note = "", f"evidence for RMA not collected: {exc}"
        log.info("%s (request %s)", note, request)
        answer = write_answer(EvidenceAnswer(request, location))
        try:
            self._api.patch_annotations(self._node, {EVIDENCE_ANNOTATION: answer})
            self._api.create_event(
                self._api.get_node(self._node),
                reason=COLLECTED if location else "EvidenceFailed",
                note=note,
                warning=not location,
                controller=AGENT_CONTROLLER,
                instance=f"{AGENT_CONTROLLER}/{self._node}",
                action=COLLECTED,
            )
        except KubeError as exc:
            log.warning("could not answer evidence request %s: %s", request, exc)

    def _store(self, history: dict[str, str]) -> tuple[str, str]:
        """Capture, store where the settings say; returns the location and the note."""
        settings, at = self._config.evidence, self._clock.now()
        assert settings is not None
        if settings.s3 is None:
            path = capture(self._config, self._sources, self._node, at, history)
            return str(path), f"evidence for RMA: {path}"
        # Only the latest failed upload's archive is kept: the agent's /tmp is small.
        for earlier in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*"):
            shutil.rmtree(earlier, ignore_errors=True)
        scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX))
        try:
            path = capture(self._config, self._sources, self._node, at, history, scratch)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        try:
            url = put_file(settings.s3, settings.s3.key_for(path.name), path, self._clock)
        except StoreError as exc:  # kept: someone may still copy it off the node
            raise StoreError(f"{exc}; the archive stays at {path} until the next request") from None
        shutil.rmtree(scratch, ignore_errors=True)
        return url, f"evidence for RMA: {url} (endpoint {settings.s3.endpoint})"

"""Checkpoints a training job can trust after any crash: atomic, checksummed, pruned.

The directory holds, per checkpoint::

    step-000000001200.json            manifest: step, payload file, size, SHA-256, serializer
    step-000000001200.3f9a0c1e.pkl    payload (``.pt`` when written by ``torch.save``)

A checkpoint exists once its manifest does: the payload is written, flushed and renamed
into place first, the manifest last, so a crash at any moment leaves the complete
checkpoint or none. `Checkpointer.restore` walks from the newest manifest back and loads
the first whose payload matches its checksum; anything else is skipped with a warning,
never loaded. A directory has one writer (rank 0, say); any number of processes may
restore from it, since only a save changes it.
"""

from __future__ import annotations

import datetime
import json
import logging
import operator
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import NotRequired, TypedDict

from gpuguard.errors import GpuguardError
from gpuguard.training.contract import CHECKPOINT_DIR_ENV
from gpuguard.training.files import TEMPORARY_PREFIX, fsync_directory, verify, write_atomically
from gpuguard.training.serialization import Prepared, StagingArea, dump, load, prepare

log = logging.getLogger("gpuguard.training")

MANIFEST_FORMAT = "gpuguard-checkpoint/1"
_MANIFEST_NAME = re.compile(r"step-(\d{12})\.json")
_PAYLOAD_NAME = re.compile(r"step-(\d{12})\.[0-9a-f]+\.(?:pkl|pt)")
_EXTENSION = {"pickle": "pkl", "torch": "pt"}
_SHA256 = re.compile(r"[0-9a-f]{64}")


class CheckpointError(GpuguardError):
    """A checkpoint could not be saved, or the checkpoints present cannot be read here."""


class Manifest(TypedDict):
    """A checkpoint's manifest file, in the `MANIFEST_FORMAT`."""

    format: str
    step: int
    payload: str  # the payload file's name, in the same directory
    serializer: str
    bytes: int
    sha256: str
    saved_at: NotRequired[str]  # ISO 8601, UTC; for people: not read back


@dataclass(frozen=True)
class Restored:
    """The checkpoint `Checkpointer.restore` found: resume after ``step``."""

    step: int
    state: object
    manifest: Path


class Checkpointer:
    """Saves a training job's state every so often and finds the newest good one again.

    ``directory`` defaults to ``$GPUGUARD_CHECKPOINT_DIR`` (set by ``gpuguard run
    --checkpoint-dir``). ``keep`` checkpoints are kept: the one just written and the
    newest others. With ``asynchronous=True`` a save copies the state into host memory
    (reused buffers: one extra copy of the state stays allocated) and writes it from a
    background thread while training goes on; at most one save is in flight, and the
    interpreter waits for it before exiting.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        keep: int = 3,
        asynchronous: bool = False,
    ) -> None:
        if directory is None:
            directory = os.environ.get(CHECKPOINT_DIR_ENV) or None
        if directory is None:
            raise CheckpointError(
                f"no checkpoint directory: pass one, or set {CHECKPOINT_DIR_ENV} "
                "(gpuguard run --checkpoint-dir DIR does)"
            )
        if keep < 1:
            raise CheckpointError(f"keep={keep}: at least one checkpoint must be kept")
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"checkpoint directory {self.directory}: {exc}") from exc
        self.keep = keep
        self.asynchronous = asynchronous
        self._staging = StagingArea()
        self._worker: threading.Thread | None = None
        self._failure: tuple[int, BaseException] | None = None
        self._unreadable: set[int] = set()

    def save(self, step: int, state: object, *, blocking: bool | None = None) -> None:
        """Save ``state`` as checkpoint ``step``.

        Asynchronous (when the checkpointer is, and ``blocking`` is not True): returns
        once the state is copied. A failure of the background write is raised by the next
        `save`, `wait` or `close`; the checkpoint before it stays the newest. A save
        always waits for the one in flight first. Raises `CheckpointError`.
        """
        try:
            step = operator.index(step)  # an int, a NumPy integer; not a float
        except TypeError:
            raise CheckpointError(f"step {step!r}: a checkpoint step is an integer") from None
        if step < 0:
            raise CheckpointError(f"step {step}: checkpoint steps are not negative")
        self.wait()
        background = self.asynchronous if blocking is None else not blocking
        try:
            prepared = prepare(state, self._staging if background else None)
            if not background:
                self._write(step, prepared)
                return
        except Exception as exc:
            raise CheckpointError(f"saving step {step} in {self.directory}: {exc}") from exc
        self._worker = threading.Thread(
            target=self._write_in_background,
            args=(step, prepared),
            name=f"gpuguard-checkpoint-{step}",
        )
        self._worker.start()

    @property
    def saving(self) -> bool:
        """True while an asynchronous save is being written."""
        return self._worker is not None and self._worker.is_alive()

    def wait(self) -> None:
        """Block until the save in flight, if any, is on disk; raise its error."""
        if self._worker is not None:
            self._worker.join()
            self._worker = None
        if self._failure is not None:
            step, error = self._failure
            self._failure = None
            raise CheckpointError(
                f"saving step {step} in {self.directory} failed in the background: {error}"
            ) from error

    close = wait

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if exc is None:
            self.wait()
            return
        try:
            self.wait()
        except CheckpointError as failure:  # the exception already leaving wins; log this one
            log.error("%s", failure)

    def restore(self, map_location: object = "cpu") -> Restored | None:
        """The newest checkpoint that verifies and loads, or None when there is none.

        ``map_location`` is passed to ``torch.load`` (tensors come back on the CPU by
        default; ``load_state_dict`` moves them to the model's device). Raises
        `CheckpointError` when a checkpoint needs a library that cannot be imported here,
        rather than going back silently to an older one.
        """
        self.wait()
        for step in reversed(self.steps()):
            manifest_path = self._manifest_path(step)
            try:
                manifest = self._read_manifest(step)
                payload = self.directory / manifest["payload"]
                verify(payload, manifest["bytes"], manifest["sha256"])
                state = load(payload, manifest["serializer"], map_location)
            except (ImportError, MemoryError) as exc:
                raise CheckpointError(f"cannot load {manifest_path} here: {exc}") from exc
            except Exception as exc:
                log.warning("skipping checkpoint %s: %s", manifest_path, exc)
                self._unreadable.add(step)
                continue
            log.info("restored checkpoint of step %d from %s", step, manifest_path)
            return Restored(step, state, manifest_path)
        return None

    def steps(self) -> list[int]:
        """Steps with a manifest on disk, oldest first (not verified: see `restore`)."""
        return sorted(
            int(match[1])
            for entry in os.scandir(self.directory)
            if (match := _MANIFEST_NAME.fullmatch(entry.name))
        )

    def _write_in_background(self, step: int, prepared: Prepared) -> None:
        try:
            self._write(step, prepared)
        except BaseException as exc:
            self._failure = (step, exc)

    def _write(self, step: int, prepared: Prepared) -> None:
        payload = f"step-{step:012d}.{os.urandom(4).hex()}.{_EXTENSION[prepared.serializer]}"
        size, sha256 = write_atomically(self.directory, payload, lambda out: dump(prepared, out))
        manifest: Manifest = {
            "format": MANIFEST_FORMAT,
            "step": step,
            "payload": payload,
            "serializer": prepared.serializer,
            "bytes": size,
            "sha256": sha256,
            "saved_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        }
        text = (json.dumps(manifest, indent=2) + "\n").encode()
        write_atomically(
            self.directory, self._manifest_path(step).name, lambda out: out.write(text)
        )
        self._prune(step)

    def _prune(self, written: int) -> None:
        """Keep the checkpoint just written and the newest others that were not found
        unreadable; then remove payloads no kept manifest names (replaced, or orphaned by
        a crash) and temporary files of a writer that died mid-save. Done here, by the
        writer after a save, so that readers never change the directory."""
        others = [s for s in reversed(self.steps()) if s != written and s not in self._unreadable]
        kept = {written, *others[: self.keep - 1]}
        for step in set(self.steps()) - kept:
            self._manifest_path(step).unlink(missing_ok=True)
            self._unreadable.discard(step)
        named: set[str] = set()
        undecided: set[int] = set()  # a kept manifest we cannot read: leave its payloads be
        for step in kept:
            try:
                named.add(self._read_manifest(step)["payload"])
            except (OSError, ValueError):
                undecided.add(step)
        for entry in os.scandir(self.directory):
            match = _PAYLOAD_NAME.fullmatch(entry.name)
            if entry.name.startswith(TEMPORARY_PREFIX) or (
                match and entry.name not in named and int(match[1]) not in undecided
            ):
                os.unlink(entry.path)
        fsync_directory(self.directory)

    def _manifest_path(self, step: int) -> Path:
        return self.directory / f"step-{step:012d}.json"

    def _read_manifest(self, step: int) -> Manifest:
        """The manifest of ``step``; ValueError naming what is wrong with it."""
        try:
            document: object = json.loads(self._manifest_path(step).read_bytes())
        except json.JSONDecodeError as exc:
            raise ValueError(f"manifest is not valid JSON ({exc})") from None
        if not isinstance(document, dict) or document.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"manifest is not in the {MANIFEST_FORMAT} format")
        manifest: dict[object, object] = document
        problems = []
        if manifest.get("step") != step:
            problems.append("its step does not match the file name")
        payload = manifest.get("payload")
        match = _PAYLOAD_NAME.fullmatch(payload) if isinstance(payload, str) else None
        if match is None or int(match[1]) != step:
            problems.append("payload does not name a payload file of this step")
        serializer = manifest.get("serializer")
        if serializer not in _EXTENSION:
            problems.append("serializer is unknown")
        size = manifest.get("bytes")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            problems.append("bytes is not a size")
        sha256 = manifest.get("sha256")
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            problems.append("sha256 is not a SHA-256 digest")
        if problems:
            raise ValueError("manifest: " + "; ".join(problems))
        # What the checks above found, told to the type checker.
        assert isinstance(payload, str) and isinstance(serializer, str)
        assert isinstance(size, int) and isinstance(sha256, str)
        return Manifest(
            format=MANIFEST_FORMAT,
            step=step,
            payload=payload,
            serializer=serializer,
            bytes=size,
            sha256=sha256,
        )

"""Dynamic Resource Allocation device taints (KEP-5055): which DeviceTaintRule version the
API server serves, the GPUs a node's ResourceSlices publish, and gpuguard's own rules.

A DeviceTaintRule taints devices of a driver's pool, so the scheduler allocates none of
them to a claim that does not tolerate the taint (and, for ``NoExecute``, kube-controller
-manager's device-taint-eviction-controller deletes the pods using them). gpuguard writes
one rule per GPU, named after the node and the device, labelled as its own so that
``gpuguard cleanup`` finds every one. Selectors name driver, pool and device only: 1.35
drops the class and CEL selectors of 1.34's v1alpha3.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuguard.contract.gpu_ids import normal_gpu_id
from gpuguard.contract.keys import TAINT_KEY
from gpuguard.kube.api_errors import KubeConflict, KubeNotFound
from gpuguard.kube.rest import Json, KubeApi, Resource

GROUP = "/apis/resource.k8s.io"
RESOURCE_SLICES = Resource(f"{GROUP}/v1", "resourceslices")
DEFAULT_DRIVER = "gpu.nvidia.com"
# Preferred first. Kubernetes 1.33-1.35 serve DeviceTaintRule only as v1alpha3 (off by
# default: --runtime-config=resource.k8s.io/v1alpha3=true, gate DRADeviceTaints); 1.36
# adds v1beta2, and v1 is expected with GA.
VERSIONS = ("v1", "v1beta2", "v1alpha3")
NO_SCHEDULE, NO_EXECUTE, NONE = "NoSchedule", "NoExecute", "None"
MANAGED_BY = "app.kubernetes.io/managed-by=gpuguard"
NODE_ANNOTATION = "gpuguard.io/node"  # the node a rule quarantines GPUs of
MAX_NAME = 253
_NOT_IN_NAME = re.compile(r"[^a-z0-9.-]+")
_NOT_IN_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class DeviceTaints:
    """What the API server serves of DeviceTaintRules (``version`` "": nothing)."""

    version: str = ""
    effects: frozenset[str] = frozenset()

    @property
    def available(self) -> bool:
        return bool(self.version)

    @property
    def rules(self) -> Resource:
        return Resource(f"{GROUP}/{self.version}", "devicetaintrules")


UNAVAILABLE = DeviceTaints()


def effects_of(version: str) -> frozenset[str]:
    """The effects ``version`` accepts. Verified here only for 1.34's v1alpha3, which
    refuses anything but NoSchedule and NoExecute. 1.35 accepts ``None`` in v1alpha3 too,
    but the version alone does not tell 1.34 from 1.35, so ``None`` is assumed only from
    v1beta2 on (1.36, per its API reference); gpuguard's quarantine never needs it."""
    if not version:
        return frozenset()
    base = {NO_SCHEDULE, NO_EXECUTE}
    return frozenset(base if version == "v1alpha3" else {*base, NONE})


def discover(api: KubeApi) -> DeviceTaints:
    """The most stable served version whose resources list ``devicetaintrules``."""
    try:
        group = api.get(GROUP)
    except KubeNotFound:
        return UNAVAILABLE
    served = {str(v.get("version")) for v in group.get("versions") or []}
    for version in VERSIONS:
        if version not in served:
            continue
        resources = api.get(f"{GROUP}/{version}").get("resources") or []
        if any(r.get("name") == "devicetaintrules" for r in resources):
            return DeviceTaints(version, effects_of(version))
    return UNAVAILABLE


@dataclass(frozen=True)
class Device:
    """One GPU a ResourceSlice publishes: where the scheduler finds it, and who it is."""

    driver: str
    pool: str
    name: str
    uuid: str = ""
    pci: str = ""  # normalised as contract.gpu_ids does

    def is_gpu(self, gpu: str) -> bool:
        wanted = normal_gpu_id(gpu)
        return wanted in (self.pci, self.uuid.lower()) and bool(wanted)


def node_devices(api: KubeApi, node: str, driver: str) -> list[Device]:
    """The devices ``driver`` publishes for ``node``, from each pool's newest generation
    (older slices are being replaced and no longer count)."""
    slices = [
        item
        for item in api.list(RESOURCE_SLICES.path(), field_selector=f"spec.nodeName={node}").items
        if (item.get("spec") or {}).get("driver") == driver
    ]
    newest: dict[str, int] = {}
    for item in slices:
        pool = item["spec"].get("pool") or {}
        name, generation = str(pool.get("name", "")), int(pool.get("generation") or 0)
        newest[name] = max(newest.get(name, generation), generation)
    devices = []
    for item in slices:
        pool = item["spec"].get("pool") or {}
        if int(pool.get("generation") or 0) != newest[str(pool.get("name", ""))]:
            continue
        for device in item["spec"].get("devices") or []:
            attributes = device.get("attributes") or {}
            devices.append(
                Device(
                    driver=driver,
                    pool=str(pool.get("name", "")),
                    name=str(device.get("name", "")),
                    uuid=_attribute(attributes, driver, "uuid"),
                    pci=normal_gpu_id(_attribute(attributes, driver, "pcieBusID")),
                )
            )
    return devices


def _attribute(attributes: Mapping[str, Json], driver: str, name: str) -> str:
    """An attribute's string value, its name bare or qualified by the driver's domain."""
    value = attributes.get(name) or attributes.get(f"{driver}/{name}") or {}
    return str(value.get("string") or "")


def resolve(devices: Iterable[Device], gpus: Iterable[str]) -> dict[str, Device] | None:
    """Each of ``gpus`` (bus ids or UUIDs) to its device; None if one is not found."""
    found: dict[str, Device] = {}
    listed = list(devices)
    for gpu in gpus:
        device = next((d for d in listed if d.is_gpu(gpu)), None)
        if device is None:
            return None
        found[gpu] = device
    return found


def rule_name(node: str, device: str) -> str:
    """``gpuguard-<node>-<device>``, a valid object name; a hash keeps long ones unique."""
    name = _NOT_IN_NAME.sub("-", f"gpuguard-{node}-{device}".lower()).strip("-.")
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: MAX_NAME - 11].rstrip('-.')}-{digest}"


def rule(taints: DeviceTaints, node: str, device: Device, effect: str, value: str) -> Json:
    """The DeviceTaintRule for ``device`` (``value``: the finding, as a taint value)."""
    if effect not in taints.effects:
        raise ValueError(f"{taints.version or 'no version'} does not accept effect {effect}")
    taint: Json = {"key": TAINT_KEY, "effect": effect}
    value = _NOT_IN_VALUE.sub("_", value)[:63].strip("_.-")
    if value:
        taint["value"] = value
    key, ours = MANAGED_BY.split("=")
    return {
        "apiVersion": f"resource.k8s.io/{taints.version}",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(node, device.name),
            "labels": {key: ours},
            "annotations": {NODE_ANNOTATION: node},
        },
        "spec": {
            "deviceSelector": {"driver": device.driver, "pool": device.pool, "device": device.name},
            "taint": taint,
        },
    }


def put_rule(api: KubeApi, taints: DeviceTaints, body: Json) -> bool:
    """Create ``body``, or bring an existing rule of that name to it; True if written."""
    path = taints.rules.path()
    name = body["metadata"]["name"]
    try:
        api.create(path, body)
        return True
    except KubeConflict:
        current = api.get(taints.rules.path(name))
    if _same(current, body):
        return False
    current_taint = (current.get("spec") or {}).get("taint") or {}
    spec = dict(body["spec"])
    if current_taint.get("effect") == body["spec"]["taint"]["effect"]:
        spec["taint"] = {**spec["taint"], "timeAdded": current_taint.get("timeAdded")}
    metadata = {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}
    api.replace(taints.rules.path(name), {**body, "metadata": metadata, "spec": spec})
    return True


def _same(current: Json, body: Json) -> bool:
    spec, wanted = current.get("spec") or {}, body["spec"]
    taint = {k: v for k, v in (spec.get("taint") or {}).items() if k != "timeAdded"}
    labels = (current.get("metadata") or {}).get("labels") or {}
    return bool(
        spec.get("deviceSelector") == wanted["deviceSelector"]
        and taint == wanted["taint"]
        and labels.items() >= body["metadata"]["labels"].items()
    )


def delete_rule(api: KubeApi, taints: DeviceTaints, name: str) -> bool:
    """Delete one rule; False if it was already gone."""
    try:
        api.delete(taints.rules.path(name))
    except KubeNotFound:
        return False
    return True


def our_rules(api: KubeApi, taints: DeviceTaints, node: str = "") -> list[Json]:
    """gpuguard's rules (of ``node`` only, if given)."""
    found = api.list(taints.rules.path(), label_selector=MANAGED_BY).items
    if not node:
        return found
    return [r for r in found if node_of(r) == node]


def node_of(found: Json) -> str:
    return str(((found.get("metadata") or {}).get("annotations") or {}).get(NODE_ANNOTATION, ""))

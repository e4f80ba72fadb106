"""The chart's RMA evidence bucket: config.evidence.s3 renders a config the agent loads,
evidence.s3SecretName hands the agent the bucket's credentials from a Secret, and the
schema refuses a store that is both a directory and a bucket, or neither."""

from __future__ import annotations

from gpuguard.config import load_config
from tests.kube.test_helm_chart import CHART, RELEASE, config_yaml, one, render

S3 = [
    "config.evidence.s3.endpoint=https://s3.us-east-1.amazonaws.com",
    "config.evidence.s3.bucket=rma-evidence",
    "config.evidence.s3.prefix=gpuguard/",
]


def test_a_bucket_and_its_secret_reach_the_agent(helm, tmp_path):
    objects = render(helm, *S3, "evidence.s3SecretName=rma-bucket")
    path = tmp_path / "config.yaml"
    path.write_text(config_yaml(objects))
    evidence = load_config(path).evidence
    assert evidence is not None and evidence.s3 is not None and evidence.directory is None
    assert (evidence.s3.bucket, evidence.s3.key_for("a.tar.gz")) == (
        "rma-evidence",
        "gpuguard/a.tar.gz",
    )
    (agent,) = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert agent["envFrom"] == [{"secretRef": {"name": "rma-bucket"}}]
    assert "evidence" not in {m["name"] for m in agent["volumeMounts"]}


def test_without_a_secret_name_no_secret_is_read(helm):
    (agent,) = one(render(helm, *S3), "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert "envFrom" not in agent


def test_the_schema_wants_one_store(helm):
    both = helm(
        "template",
        RELEASE,
        str(CHART),
        *(f"--set={s}" for s in S3),
        "--set=config.evidence.directory=/var/lib/gpuguard/evidence",
        ok=False,
    )
    assert "evidence" in both
    bad = helm("template", RELEASE, str(CHART), "--set=config.evidence.s3.bucket=rma", ok=False)
    assert "endpoint" in bad


def test_a_directory_store_is_still_mounted_from_the_node(helm):
    directory = "/var/lib/gpuguard/evidence"
    objects = render(
        helm, f"config.evidence.directory={directory}", f"evidence.hostPath={directory}"
    )
    (agent,) = one(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    assert mounts["evidence"] == directory and "envFrom" not in agent

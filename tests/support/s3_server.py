"""A real S3-compatible server on loopback for the evidence tests: moto's (Apache-2.0, the
``dev`` extra), in a thread, with its authentication on, so that each request's SigV4
signature is checked, and one user whose key may write the one bucket."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import boto3
from moto.server import ThreadedMotoServer

BUCKET = "gpuguard-evidence"
REGION = "us-east-1"
ALLOW_S3 = '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}'


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str

    def client(self) -> object:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def environ(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key}


def _moto_api(endpoint: str, call: str, body: str = "") -> None:
    """``reset``: forget every user and bucket (moto keeps them per process, not per
    server); ``reset-auth``: check credentials after this many requests ("inf": never)."""
    request = urllib.request.Request(
        f"{endpoint}/moto-api/{call}",
        data=body.encode(),
        headers={"Content-Type": "text/plain"},  # a form's body would read as empty
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


@contextmanager
def s3_server() -> Iterator[S3Server]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    _moto_api(endpoint, "reset")
    setup = {"endpoint_url": endpoint, "region_name": REGION}
    setup |= {"aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
    iam = boto3.client("iam", **setup)
    iam.create_user(UserName="agent")
    iam.put_user_policy(UserName="agent", PolicyName="s3", PolicyDocument=ALLOW_S3)
    key = iam.create_access_key(UserName="agent")["AccessKey"]
    boto3.client("s3", **setup).create_bucket(Bucket=BUCKET)
    _moto_api(endpoint, "reset-auth", "0")
    try:
        yield S3Server(endpoint, key["AccessKeyId"], key["SecretAccessKey"])
    finally:
        _moto_api(endpoint, "reset-auth", "inf")
        _moto_api(endpoint, "reset")
        server.stop()

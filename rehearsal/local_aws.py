"""moto's server on 127.0.0.1 standing in for the AWS services a rehearsed pod calls (S3 for the
weights, Secrets Manager for the API keys and the GCS store's token), with the dummy credentials
both sides use."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

REGION = "us-east-1"
# For Ray's processes: what a pod's credentials and region would be.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "rehearsal", "AWS_SECRET_ACCESS_KEY": "rehearsal", "AWS_REGION": REGION}


@contextlib.contextmanager
def moto_server(port: int) -> Iterator[str]:
    """moto's server for the block; its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def client(service: str, endpoint: str) -> Any:
    """A boto3 client of ``service`` on moto's ``endpoint``."""
    import boto3

    return boto3.client(service, endpoint_url=endpoint, region_name=REGION,
                        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])  # fmt: skip

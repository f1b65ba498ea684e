"""Record the S3 calls Ray Serve LLM's model mirror makes when an engine starts, at the image's
Ray version, for the IAM rung (tests/template/test_iam_rung.py) to judge against the workers' role.

Runs in the Ray virtualenv (.venv-ray, requirements-ray.txt), never in the CDK one:

    .venv-ray/bin/python tools/ray_s3_mirror_calls.py <bucket> <prefix> <file>...

Stages ``<prefix>/<file>`` (and nothing else) in moto's in-process S3, then runs Ray's own
``CloudFileSystem.download_model`` for ``s3://<bucket>/<prefix>``, the call its engine start makes
(``download_utils.CloudModelDownloader.get_model``), into a temporary directory. Every S3 call
botocore sends is printed as one JSON line: operation, Bucket/Key/Prefix, HTTP status, error code.
moto answers a missing key 404 whoever asks; the rung applies S3's 403 rule. Exit 0.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any


def main(argv: list[str]) -> int:
    bucket, prefix, *files = argv
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        os.environ.setdefault(name, value)
    import boto3
    from moto import mock_aws
    from ray.llm._internal.common.utils.cloud_utils import CloudFileSystem

    calls: list[dict[str, Any]] = []

    def keep(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["eks_pd_params"] = {k: params[k] for k in ("Bucket", "Key", "Prefix") if k in params}

    def after(http_response: Any, parsed: dict[str, Any], model: Any, context: Any = None, **_: Any) -> None:
        calls.append(
            {
                "operation": model.name,
                "params": (context or {}).get("eks_pd_params", {}),
                "status": parsed.get("ResponseMetadata", {}).get("HTTPStatusCode"),
                "error": parsed.get("Error", {}).get("Code"),
            }
        )

    with mock_aws():
        setup = boto3.client("s3")
        setup.create_bucket(Bucket=bucket)
        for name in files:
            setup.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=b"x")
        # Ray builds its clients with boto3.client(...): the default session's handlers are copied
        # into each client it creates.
        boto3.setup_default_session()
        assert boto3.DEFAULT_SESSION is not None
        boto3.DEFAULT_SESSION.events.register("provide-client-params.s3.*", keep)
        boto3.DEFAULT_SESSION.events.register("after-call.s3.*", after)
        with tempfile.TemporaryDirectory() as destination:
            CloudFileSystem.download_model(destination, f"s3://{bucket}/{prefix}", tokenizer_only=False)
    for call in calls:
        print(json.dumps(call, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

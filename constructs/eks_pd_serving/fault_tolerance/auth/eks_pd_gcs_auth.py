"""The Ray head's init container, and that of KubeRay's Redis cleanup Job (which keeps the head's
init containers): reads the GCS store's auth token from Secrets Manager and writes it as an env
file to a memory-backed emptyDir. The kubelet reads that file into the Ray container's
REDIS_PASSWORD (``valueFrom.fileKeyRef``, Kubernetes 1.35 EnvFiles), so the token is in no
manifest, no Kubernetes Secret and no log line. Standard library and the image's boto3 only; the
container runs it as ``python -c <this file>``.
"""

from __future__ import annotations

import json
import os
import re
import sys

SECRET_ENV = "EKS_PD_GCS_AUTH_SECRET"  # the secret's ARN
FILE_ENV = "EKS_PD_GCS_AUTH_FILE"  # where the env file goes
KEY = "REDIS_PASSWORD"  # the one key of the env file, as KubeRay names the variable
FIELD = "token"  # the secret's JSON field
# ElastiCache's auth token rules (16 to 128 printable characters) narrowed to what needs no
# quoting in an env file or a shell: the stack's token is letters and digits.
_TOKEN = re.compile(r"[A-Za-z0-9]{16,128}")


def token(secret_string: str) -> str:
    """The token from the secret's JSON; a ValueError that never contains it."""
    try:
        value = json.loads(secret_string).get(FIELD)
    except (ValueError, AttributeError):
        raise ValueError(f"the secret is not a JSON object with a {FIELD!r} field") from None
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise ValueError(f"the secret's {FIELD!r} is not 16 to 128 letters and digits")
    return value


def write(path: str, value: str) -> None:
    """Replace ``path`` at once (a restarted init container never leaves half a file), owner-only."""
    partial = f"{path}.partial"
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"{KEY}={value}\n")
    os.replace(partial, path)


def main() -> int:
    arn, path = os.environ[SECRET_ENV], os.environ[FILE_ENV]
    import boto3  # the image's; botocore takes no region from the ARN, so it is passed

    client = boto3.client("secretsmanager", region_name=arn.split(":")[3])
    try:
        value = token(client.get_secret_value(SecretId=arn)["SecretString"])
    except Exception as exc:  # one line to the pod's log; the pod restarts this container
        print(f"eks-pd gcs-auth: cannot read {arn}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    write(path, value)
    print(f"eks-pd gcs-auth: wrote {KEY} to {path} from {arn}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

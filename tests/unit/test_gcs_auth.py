"""The Ray head's init container for the GCS store (fault_tolerance/auth/eks_pd_gcs_auth.py): the
token read from Secrets Manager (moto) in the secret's region, written as the one-line env file
the kubelet reads (KEY=value, owner-only, replaced at once), and refused without the token in any
message; run as the pod runs it (``python -c <source>``) when Secrets Manager cannot be reached."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from eks_pd_serving.fault_tolerance import auth
from eks_pd_serving.fault_tolerance.auth import eks_pd_gcs_auth as reader

TOKEN = "Tk" * 32  # 64 letters, the stack's length


@mock_aws
def test_the_token_is_read_in_the_secrets_region_and_written_as_the_env_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on a pod: no region in the environment; the ARN names it.
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    arn = boto3.client("secretsmanager", region_name="eu-west-1").create_secret(
        Name="gcs-token", SecretString=json.dumps({auth.FIELD: TOKEN})
    )["ARN"]
    target = tmp_path / auth.ENV_FILE
    monkeypatch.setenv(auth.SECRET_ENV, arn)
    monkeypatch.setenv(auth.FILE_ENV, str(target))
    assert reader.main() == 0
    assert target.read_text() == f"REDIS_PASSWORD={TOKEN}\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize(
    ("secret", "message"),
    [
        ("not json", "not a JSON object"),
        (json.dumps(["a"]), "not a JSON object"),
        (json.dumps({"other": TOKEN}), "is not 16 to 128 letters and digits"),
        (json.dumps({auth.FIELD: "short"}), "is not 16 to 128 letters and digits"),
        (json.dumps({auth.FIELD: TOKEN[:40] + "\nX=1"}), "is not 16 to 128 letters and digits"),
    ],
)
def test_a_secret_without_a_usable_token_is_refused_without_echoing_it(secret: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as refused:
        reader.token(secret)
    assert TOKEN not in str(refused.value) and "short" not in str(refused.value)


def test_a_rewrite_replaces_the_file_whole(tmp_path: Path) -> None:
    target = tmp_path / auth.ENV_FILE
    reader.write(str(target), TOKEN)
    reader.write(str(target), "N" * 20)
    assert target.read_text() == "REDIS_PASSWORD=" + "N" * 20 + "\n"


def test_as_the_pod_runs_it_an_unreachable_secrets_manager_fails_in_one_line_and_writes_nothing(
    tmp_path: Path,
) -> None:
    target = tmp_path / auth.ENV_FILE
    env = {
        "PATH": os.environ["PATH"],
        auth.SECRET_ENV: "arn:aws:secretsmanager:us-east-1:123456789012:secret:gcs-token-AbCdEf",
        auth.FILE_ENV: str(target),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_ENDPOINT_URL_SECRETS_MANAGER": "http://127.0.0.1:9",  # discard port: refused at once
        "AWS_MAX_ATTEMPTS": "1",
    }
    result = subprocess.run(
        [sys.executable, "-c", auth.source()], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("eks-pd gcs-auth: cannot read arn:aws:secretsmanager:us-east-1:")
    assert not target.exists()

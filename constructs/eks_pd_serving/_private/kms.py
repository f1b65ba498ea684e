"""The one kind of KMS key this package makes: rotating, deleted with the stack after 30 days."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy
from aws_cdk import aws_kms as kms
from constructs import Construct

# KMS's minimum is 7 days; 30 leaves time to recover what a deleted stack encrypted.
PENDING_WINDOW = Duration.days(30)


def rotating_key(scope: Construct, id: str, description: str) -> kms.Key:
    return kms.Key(
        scope,
        id,
        description=description,
        enable_key_rotation=True,
        removal_policy=RemovalPolicy.DESTROY,
        pending_window=PENDING_WINDOW,
    )

"""The one kind of secret this package generates: a JSON object with one field of letters and
digits (no punctuation, so it survives any shell, env file or ElastiCache's token rules), made by
Secrets Manager at deploy so no value is in the template, encrypted with the caller's key and
deleted with the stack."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_kms as kms
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct


def generated_secret(
    scope: Construct, id: str, *, description: str, key: kms.IKey, field: str, length: int
) -> secretsmanager.Secret:
    return secretsmanager.Secret(
        scope,
        id,
        description=description,
        encryption_key=key,
        generate_secret_string=secretsmanager.SecretStringGenerator(
            secret_string_template="{}",
            generate_string_key=field,
            exclude_punctuation=True,
            password_length=length,
        ),
        removal_policy=RemovalPolicy.DESTROY,
    )

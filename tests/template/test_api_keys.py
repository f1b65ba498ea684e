"""API keys on the endpoint: the secret (generated at deploy, never in the template), who may read
it (the Ray pods' accounts through EKS Pod Identity, that secret only), what every Ray pod runs to
check keys, the order of deploy and destroy, TLS on the NLB, and the settings' refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk.assertions import Template
from support import API_KEYS_SECRET_ARN, build_stack, resources_of_type

from eks_pd_serving.assembly import kubernetes_objects
from eks_pd_serving.config import ConfigError, DeploymentConfig
from eks_pd_serving.endpoint import proxy
from eks_pd_serving.fault_tolerance import failover, kv_guard
from eks_pd_serving.k8s.network import RAY_NODE_LABELS
from eks_pd_serving.weights import node_cache

CERTIFICATE = "arn:aws:acm:us-east-1:123456789012:certificate/12345678-1234-1234-1234-123456789012"
# Ray Serve's flags that replace the Python proxy (HAProxy, direct ingress) or make decode the
# ASGI ingress: with any on, the proxy hook would not guard every request.
# Switches that route requests around the Serve proxies' check. RAY_SERVE_THROUGHPUT_OPTIMIZED=1
# turns direct ingress on by default (Ray 2.58 serve/_private/constants.py, its last block).
BYPASSES = (
    "RAY_SERVE_ENABLE_HA_PROXY",
    "RAY_SERVE_ENABLE_DIRECT_INGRESS",
    "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING",
    "RAY_SERVE_THROUGHPUT_OPTIMIZED",
)


@pytest.fixture(scope="module")
def internal() -> dict[str, Any]:
    return dict(Template.from_stack(build_stack(endpoint_exposure="internal", region="us-east-1")).to_json())


def _ray_service(template: dict[str, Any]) -> dict[str, Any]:
    (service,) = [o for o in kubernetes_objects(template) if o["kind"] == "RayService"]
    return service


def _pods(service: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = service["spec"]["rayClusterConfig"]
    return [g["template"] for g in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"])]


def _key_secrets(template: dict[str, Any]) -> dict[str, Any]:
    """The API key secrets (the GCS store's token is a secret of the default deployment too)."""
    return {
        rid: r
        for rid, r in resources_of_type(template, "AWS::SecretsManager::Secret").items()
        if r["Properties"]["Description"].startswith("API keys")
    }


def _env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}


def test_the_stack_generates_the_first_key_at_deploy_and_encrypts_it_with_its_own_key(internal: dict[str, Any]) -> None:
    ((_secret_id, secret),) = _key_secrets(internal).items()
    generated = secret["Properties"]["GenerateSecretString"]
    assert generated == {
        "ExcludePunctuation": True,
        "GenerateStringKey": "initial",
        "PasswordLength": 48,
        "SecretStringTemplate": "{}",
    }
    assert "SecretString" not in secret["Properties"]
    key_id = secret["Properties"]["KmsKeyId"]["Fn::GetAtt"][0]
    assert internal["Resources"][key_id]["Properties"]["EnableKeyRotation"] is True
    assert (secret["DeletionPolicy"], internal["Resources"][key_id]["DeletionPolicy"]) == ("Delete", "Delete")


def test_every_ray_pod_loads_the_check_and_names_the_secret_not_a_key(internal: dict[str, Any]) -> None:
    (secret_id,) = _key_secrets(internal)
    service = _ray_service(internal)
    for pod in _pods(service):
        env = _env(pod)
        assert env[proxy.CALLBACK_ENV] == "eks_pd_api_keys:middlewares"
        # The check's folder first; every pod's PYTHONPATH also holds the failover's, a GPU
        # worker's the KV guard's before it and the node cache's after it.
        assert env["PYTHONPATH"] in (
            f"{proxy.MOUNT_PATH}:{failover.MOUNT_PATH}",
            f"{proxy.MOUNT_PATH}:{kv_guard.MOUNT_PATH}:{failover.MOUNT_PATH}:{node_cache.MOUNT_PATH}",
        )
        assert env[proxy.SECRET_ENV] == f"<{secret_id}>"  # the Ref, resolved when kubectl applies
        assert env[proxy.REFRESH_ENV] == "30" and env["AWS_REGION"] == "us-east-1"
        assert env[proxy.MAX_STALE_ENV] == "300"  # revoked keys die within this while reads fail
        assert not {name for name in BYPASSES if env.get(name) == "1"}
        assert pod["metadata"]["annotations"][proxy_code_annotation()] == proxy.source_digest()
    maps = [o["data"] for o in kubernetes_objects(internal) if o["kind"] == "ConfigMap"]
    assert {"eks_pd_api_keys.py": proxy.source()} in maps
    # Nothing the pods or Serve are given holds a key: the serve config has no key setting at all.
    assert "api_key" not in service["spec"]["serveConfigV2"].lower()


def proxy_code_annotation() -> str:
    from eks_pd_serving.mapping import API_KEYS_CODE

    return API_KEYS_CODE


def test_only_the_ray_pods_accounts_read_the_secret_and_nothing_else(internal: dict[str, Any]) -> None:
    (secret_id,) = _key_secrets(internal)
    associations = {
        a["Properties"]["ServiceAccount"]: a
        for a in resources_of_type(internal, "AWS::EKS::PodIdentityAssociation").values()
        if a["Properties"]["Namespace"] == "inference"
    }
    assert set(associations) == {"ray-llm-head", "ray-llm-workers"}
    readers = []
    for policy in resources_of_type(internal, "AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            granted = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            if "secretsmanager:GetSecretValue" in statement["Action"] and {"Ref": secret_id} in granted:
                readers += [r["Ref"] for r in policy["Properties"]["Roles"]]
    roles = {a["Properties"]["RoleArn"]["Fn::GetAtt"][0] for a in associations.values()}
    assert sorted(readers) == sorted(roles)


def test_the_ray_service_waits_for_both_associations(internal: dict[str, Any]) -> None:
    association_ids = {
        rid
        for rid, a in resources_of_type(internal, "AWS::EKS::PodIdentityAssociation").items()
        if a["Properties"]["Namespace"] == "inference"
    }
    assert len(association_ids) == 2
    (manifest,) = [r for r in resources_of_type(internal, "Custom::AWSCDK-EKS-KubernetesResource").values()
                   if '"kind":"RayService"' in json.dumps(r["Properties"]["Manifest"]).replace("\\", "")]  # fmt: skip
    assert association_ids <= set(manifest["DependsOn"])


def test_port_forward_has_no_check_unless_asked() -> None:
    default = dict(Template.from_stack(build_stack()).to_json())
    assert not _key_secrets(default)
    # The proxy hook is on every pod (the body's bound), the keys are not.
    assert all(proxy.SECRET_ENV not in _env(pod) for pod in _pods(_ray_service(default)))
    assert all(proxy.MAX_BODY_ENV in _env(pod) for pod in _pods(_ray_service(default)))
    asked = dict(Template.from_stack(build_stack(api_keys=True)).to_json())
    assert _key_secrets(asked)
    assert all(proxy.SECRET_ENV in _env(pod) for pod in _pods(_ray_service(asked)))


def test_internal_can_be_left_open_on_purpose() -> None:
    open_nlb = dict(Template.from_stack(build_stack(endpoint_exposure="internal", api_keys=False)).to_json())
    assert not _key_secrets(open_nlb)
    assert all(proxy.SECRET_ENV not in _env(pod) for pod in _pods(_ray_service(open_nlb)))


def test_a_brought_secret_is_read_by_its_arn_and_not_created() -> None:
    template = dict(
        Template.from_stack(
            build_stack(endpoint_exposure="internal", region="us-east-1", api_keys_secret_arn=API_KEYS_SECRET_ARN)
        ).to_json()
    )
    assert not _key_secrets(template)
    assert {_env(pod)[proxy.SECRET_ENV] for pod in _pods(_ray_service(template))} == {API_KEYS_SECRET_ARN}
    resources = [
        r
        for p in resources_of_type(template, "AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        if "secretsmanager:GetSecretValue" in s["Action"]
        for r in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]])
        if isinstance(r, str)
    ]
    assert resources == [API_KEYS_SECRET_ARN, API_KEYS_SECRET_ARN]


def test_tls_puts_the_certificate_on_443_and_turns_plain_http_off() -> None:
    template = dict(
        Template.from_stack(build_stack(endpoint_exposure="internal", tls_certificate_arn=CERTIFICATE)).to_json()
    )
    (service,) = [
        o for o in kubernetes_objects(template) if o["kind"] == "Service" and o["spec"].get("type") == "LoadBalancer"
    ]
    annotations = service["metadata"]["annotations"]
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-ssl-cert"] == CERTIFICATE
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-ssl-ports"] == "https"
    assert annotations["service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy"].startswith(
        "ELBSecurityPolicy-TLS13"
    )
    assert [(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [("https", 443, 8000)]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tls_certificate_arn": CERTIFICATE}, "tls_certificate_arn=.* needs the internal NLB"),
        (
            {"endpoint_exposure": "internal", "tls_certificate_arn": "arn:aws:acm:us-east-1:1:certificate/x"},
            "not an ACM certificate ARN",
        ),
        (
            {"endpoint_exposure": "internal", "region": "eu-west-1", "tls_certificate_arn": CERTIFICATE},
            "is in us-east-1, not region='eu-west-1'",
        ),
        (
            {
                "endpoint_exposure": "internal",
                "api_keys_secret_arn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:api-keys",
            },
            "complete ARN",
        ),
        ({"api_keys_secret_arn": API_KEYS_SECRET_ARN}, "unused with api_keys off"),
        ({"api_keys_refresh_s": 1}, "api_keys_refresh_s"),
    ],
)
def test_settings_that_cannot_work_are_refused_in_one_line(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        DeploymentConfig.create(**settings)
    assert "\n" not in str(raised.value)


def test_a_key_pasted_as_the_secret_arn_is_not_echoed() -> None:
    canary = "sk-canary-0123456789abcdefghijklmnopqrstuvwxyz"
    with pytest.raises(ConfigError) as raised:
        DeploymentConfig.create(endpoint_exposure="internal", api_keys_secret_arn=canary)
    assert canary not in str(raised.value) and "api_keys_secret_arn=<hidden>" in str(raised.value)


def test_every_pod_the_serve_port_admits_clients_to_checks_keys(internal: dict[str, Any]) -> None:
    """The lock-down and the check together: port 8000 is open (to the namespace and the NLB's
    subnets) only on Ray pods, and every Ray pod's proxy runs the check."""
    policies = {o["metadata"]["name"]: o for o in kubernetes_objects(internal) if o["kind"] == "NetworkPolicy"}
    opened_8000 = [
        policy
        for policy in policies.values()
        for rule in policy["spec"].get("ingress", [])
        if any(port.get("port") == 8000 for port in rule.get("ports", []))
    ]
    selectors = [p["spec"]["podSelector"]["matchLabels"] for p in opened_8000]
    assert opened_8000 and all(labels.items() >= RAY_NODE_LABELS.items() for labels in selectors)
    # KubeRay labels every pod of every group with RAY_NODE_LABELS; each group's pods load the check.
    assert all(_env(pod)[proxy.CALLBACK_ENV] == proxy.CALLBACK for pod in _pods(_ray_service(internal)))


def test_failed_key_reads_alarm_only_with_keys_on(internal: dict[str, Any], template: Template) -> None:
    from support import log_filter_matches

    from eks_pd_serving import observability as om

    filters = {
        f["Properties"]["MetricTransformations"][0]["MetricName"]: f["Properties"]["FilterPattern"]
        for f in resources_of_type(internal, "AWS::Logs::MetricFilter").values()
    }
    pattern = filters[om.API_KEYS_UNREAD_METRIC]
    alarms = [
        a["Properties"]
        for k, a in resources_of_type(internal, "AWS::CloudWatch::Alarm").items()
        if "ApiKeysUnread" in k
    ]
    (alarm,) = alarms
    assert (alarm["MetricName"], alarm["Threshold"], alarm["Period"]) == (om.API_KEYS_UNREAD_METRIC, 3, 300)
    # The line the check logs for a failed read, and not its other lines.
    lines = [
        "WARNING ray.serve -- API keys not read (ConnectionError: no route); the 1 held served for 30 s more",
        "WARNING ray.serve -- API key entry dropped: the key of 'typo' is not a string of 32 or more",
        "INFO 2026-12-03 ray.serve -- api_key refused GET /API%20keys%20not%20read: no key",
    ]
    assert log_filter_matches(pattern, lines) == lines[:1]
    default = dict(template.to_json())
    assert not [k for k in resources_of_type(default, "AWS::CloudWatch::Alarm") if "ApiKeysUnread" in k]

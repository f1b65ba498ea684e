"""Ray head fault tolerance: the GCS store (ElastiCache for Valkey: TLS, auth token generated at
deploy, encrypted, reachable from the cluster security group only, deleted on destroy), how the
head reaches it (KubeRay's gcsFaultToleranceOptions, the token through the init container's env
file, never a manifest), who may read the token, KubeRay 1.7's own refusals, and the settings."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk.assertions import Template
from support import build_stack, resources_of_type

from eks_pd_serving import versions
from eks_pd_serving.assembly import kubernetes_objects
from eks_pd_serving.config import ConfigError, DeploymentConfig
from eks_pd_serving.fault_tolerance import auth
from eks_pd_serving.mapping import GCS_AUTH_CODE, GCS_AUTH_CONTAINER


@pytest.fixture(scope="module")
def default() -> dict[str, Any]:
    return dict(Template.from_stack(build_stack(region="us-east-1")).to_json())


def _one(template: dict[str, Any], type_: str) -> tuple[str, dict[str, Any]]:
    (item,) = resources_of_type(template, type_).items()
    return item


def _token_secret(template: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    (item,) = [
        (rid, r)
        for rid, r in resources_of_type(template, "AWS::SecretsManager::Secret").items()
        if "GCS store" in r["Properties"]["Description"]
    ]
    return item


def _cluster(template: dict[str, Any]) -> dict[str, Any]:
    (service,) = [o for o in kubernetes_objects(template) if o["kind"] == "RayService"]
    return dict(service["spec"]["rayClusterConfig"])


def _ray_service_manifest(template: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    (item,) = [(rid, r) for rid, r in resources_of_type(template, "Custom::AWSCDK-EKS-KubernetesResource").items()
               if '"kind":"RayService"' in json.dumps(r["Properties"]["Manifest"]).replace("\\", "")]  # fmt: skip
    return item


def test_the_store_is_one_shard_valkey_over_tls_with_a_generated_token_and_encrypted(default: dict[str, Any]) -> None:
    store_id, store = _one(default, "AWS::ElastiCache::ReplicationGroup")
    props = store["Properties"]
    assert (props["Engine"], props["EngineVersion"]) == ("valkey", versions.GCS_STORE_ENGINE_VERSION)
    # Cluster mode disabled (Ray's GCS takes one shard): no node groups, a primary and a replica.
    assert "NumNodeGroups" not in props and "ReplicasPerNodeGroup" not in props
    assert (props["NumCacheClusters"], props["AutomaticFailoverEnabled"], props["MultiAZEnabled"]) == (2, True, True)
    assert (props["TransitEncryptionEnabled"], props["TransitEncryptionMode"]) == (True, "required")
    token_id, token = _token_secret(default)
    # The token is a dynamic reference resolved by CloudFormation, never a literal in the template.
    assert props["AuthToken"] == {
        "Fn::Join": ["", ["{{resolve:secretsmanager:", {"Ref": token_id}, ":SecretString:" + auth.FIELD + "::}}"]]
    }
    assert token["Properties"]["GenerateSecretString"] == {
        "ExcludePunctuation": True,
        "GenerateStringKey": auth.FIELD,
        "PasswordLength": 64,
        "SecretStringTemplate": "{}",
    }
    key_id = props["KmsKeyId"]["Fn::GetAtt"][0]
    assert props["AtRestEncryptionEnabled"] is True and token["Properties"]["KmsKeyId"]["Fn::GetAtt"][0] == key_id
    assert default["Resources"][key_id]["Properties"]["EnableKeyRotation"] is True
    assert props["SnapshotRetentionLimit"] == 0
    # Destroy deletes the store, its token and (after its pending window) its key.
    assert {default["Resources"][r]["DeletionPolicy"] for r in (store_id, token_id, key_id)} == {"Delete"}


def test_only_the_cluster_security_group_reaches_the_store_port(default: dict[str, Any]) -> None:
    _, store = _one(default, "AWS::ElastiCache::ReplicationGroup")
    ((group_ref,),) = [store["Properties"]["SecurityGroupIds"]]
    group = default["Resources"][group_ref["Fn::GetAtt"][0]]["Properties"]
    rules = group.get("SecurityGroupIngress", []) + [
        r["Properties"]
        for r in resources_of_type(default, "AWS::EC2::SecurityGroupIngress").values()
        if r["Properties"]["GroupId"] == group_ref
    ]
    (rule,) = rules
    assert (rule["FromPort"], rule["ToPort"], rule["IpProtocol"]) == (versions.GCS_STORE_PORT,) * 2 + ("tcp",)
    (cluster_id, _) = _one(default, "AWS::EKS::Cluster")
    assert rule["SourceSecurityGroupId"] == {"Fn::GetAtt": [cluster_id, "ClusterSecurityGroupId"]}
    assert "CidrIp" not in rule
    # No way out of the store's group (CDK's placeholder egress rule matches nothing).
    assert group["SecurityGroupEgress"] == [
        {"CidrIp": "255.255.255.255/32", "Description": "Disallow all traffic", "FromPort": 252, "IpProtocol": "icmp",
         "ToPort": 86}
    ]  # fmt: skip
    _, subnets = _one(default, "AWS::ElastiCache::SubnetGroup")
    private = {rid for rid in resources_of_type(default, "AWS::EC2::Subnet") if "Private" in rid}
    assert {s["Ref"] for s in subnets["Properties"]["SubnetIds"]} == private


def test_the_head_names_the_store_and_takes_the_token_from_its_init_container(default: dict[str, Any]) -> None:
    store_id, _ = _one(default, "AWS::ElastiCache::ReplicationGroup")
    token_id, _ = _token_secret(default)
    _, manifest = _ray_service_manifest(default)
    # TLS, and the port written out (KubeRay's cleanup Job reads it from the URL).
    assert {"Fn::GetAtt": [store_id, "PrimaryEndPoint.Address"]} in manifest["Properties"]["Manifest"]["Fn::Join"][1]
    assert '\\"redisAddress\\":\\"rediss://"' in json.dumps(manifest["Properties"]["Manifest"])
    assert f':{versions.GCS_STORE_PORT}\\"' in json.dumps(manifest["Properties"]["Manifest"])
    cluster = _cluster(default)
    assert cluster["gcsFaultToleranceOptions"]["redisPassword"] == {
        "valueFrom": {"fileKeyRef": {"volumeName": auth.VOLUME, "path": auth.ENV_FILE, "key": "REDIS_PASSWORD"}}
    }
    pod = cluster["headGroupSpec"]["template"]
    (init,) = pod["spec"]["initContainers"]
    (ray,) = pod["spec"]["containers"]
    assert init["command"] == ["python", "-c", auth.source()] and init["image"] == ray["image"]
    env = {e["name"]: e["value"] for e in init["env"]}
    assert env == {auth.SECRET_ENV: f"<{token_id}>", auth.FILE_ENV: f"{auth.MOUNT_PATH}/{auth.ENV_FILE}"}
    assert init["volumeMounts"] == [{"name": auth.VOLUME, "mountPath": auth.MOUNT_PATH}]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == auth.VOLUME]
    assert volume["emptyDir"]["medium"] == "Memory"  # the token never touches the node's disk
    assert all(m["name"] != auth.VOLUME for m in ray["volumeMounts"])  # the kubelet reads it, not Ray
    # Guaranteed QoS holds only if every container, init included, requests what it limits.
    assert init["resources"]["requests"] == init["resources"]["limits"]
    assert pod["metadata"]["annotations"][GCS_AUTH_CODE] == auth.source_digest()


def test_kuberay_1_7_would_accept_the_head_and_keep_the_init_container_in_its_cleanup_job(
    default: dict[str, Any],
) -> None:
    """ray-operator/controllers/ray/utils/validation.go (v1.7.0) refuses these with gcsFaultToleranceOptions;
    buildRedisCleanupJob drops only an init container named wait-for-tls-ip-san."""
    cluster = _cluster(default)
    head = cluster["headGroupSpec"]
    (ray,) = head["template"]["spec"]["containers"]
    names = {e["name"] for e in ray.get("env", [])}
    assert not {"REDIS_PASSWORD", "RAY_REDIS_ADDRESS", "REDIS_USERNAME"} & names
    assert not {"redis-password", "redis-username"} & set(head["rayStartParams"])
    assert "ray.io/external-storage-namespace" not in head["template"].get("metadata", {}).get("annotations", {})
    assert "storage" not in cluster["gcsFaultToleranceOptions"]  # a rocksdb-only field
    assert GCS_AUTH_CONTAINER != "wait-for-tls-ip-san"


def test_only_the_heads_account_reads_the_token_and_the_ray_service_waits_for_it(default: dict[str, Any]) -> None:
    token_id, _ = _token_secret(default)
    readers = []
    for policy in resources_of_type(default, "AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            granted = statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            if {"Ref": token_id} in granted:
                assert set(statement["Action"]) == {"secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"}
                readers += [r["Ref"] for r in policy["Properties"]["Roles"]]
    associations = {
        a["Properties"]["ServiceAccount"]: (rid, a)
        for rid, a in resources_of_type(default, "AWS::EKS::PodIdentityAssociation").items()
    }
    head_id, head = associations["ray-llm-head"]
    assert readers == [head["Properties"]["RoleArn"]["Fn::GetAtt"][0]]
    _, manifest = _ray_service_manifest(default)
    assert head_id in manifest["DependsOn"]


def test_no_manifest_and_no_output_carries_the_token(default: dict[str, Any]) -> None:
    """The kubectl handler logs every manifest it applies: only the secret's ARN may appear there."""
    token_id, _ = _token_secret(default)
    for rid, manifest in resources_of_type(default, "Custom::AWSCDK-EKS-KubernetesResource").items():
        text = json.dumps(manifest["Properties"])
        assert "{{resolve:" not in text, rid
    assert "{{resolve:" not in json.dumps(default.get("Outputs", {}))
    store_readers = [rid for rid, r in default["Resources"].items() if "{{resolve:secretsmanager:" in json.dumps(r)]
    assert store_readers == [_one(default, "AWS::ElastiCache::ReplicationGroup")[0]]
    assert {"Ref": token_id} != default["Outputs"].get("GcsStoreId", {}).get("Value")


def test_without_fault_tolerance_there_is_no_store_no_init_container_and_no_head_access() -> None:
    template = dict(Template.from_stack(build_stack(gcs_fault_tolerance=False)).to_json())
    assert not resources_of_type(template, "AWS::ElastiCache::ReplicationGroup")
    cluster = _cluster(template)
    assert "gcsFaultToleranceOptions" not in cluster
    assert "initContainers" not in cluster["headGroupSpec"]["template"]["spec"]
    associations = resources_of_type(template, "AWS::EKS::PodIdentityAssociation").values()
    accounts = [a["Properties"]["ServiceAccount"] for a in associations]
    assert "ray-llm-head" not in accounts
    assert "GcsStoreId" not in template.get("Outputs", {})


def test_no_replicas_is_one_node_without_failover() -> None:
    stack = build_stack(gcs_store_replicas=0, gcs_store_node_type="cache.m7g.large")
    template = dict(Template.from_stack(stack).to_json())
    _, store = _one(template, "AWS::ElastiCache::ReplicationGroup")
    props = store["Properties"]
    assert (props["NumCacheClusters"], props["AutomaticFailoverEnabled"], props["MultiAZEnabled"]) == (1, False, False)
    assert props["CacheNodeType"] == "cache.m7g.large"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"gcs_store_node_type": "t4g.small"}, "gcs_store_node_type"),
        ({"gcs_store_replicas": 6}, "gcs_store_replicas"),
        ({"gcs_fault_tolerance": False, "gcs_store_replicas": 2}, "gcs_store_replicas=2 has no store to size"),
        ({"kubernetes_version": "1.34"}, "gcs_fault_tolerance=true needs Kubernetes 1.35 or later"),
    ],
)
def test_settings_that_cannot_work_are_refused_in_one_line(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        DeploymentConfig.create(**settings)
    assert "\n" not in str(refused.value) and "Fix" in str(refused.value)

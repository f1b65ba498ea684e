#!/usr/bin/env python3
"""An account-vending pipeline's app: two deployments of different sizes from typed props.

Copy this next to your pipeline, `pip install <this repository>` (which brings aws-cdk-lib and
everything else), and run `cdk synth`. Nothing here reads this repository's cdk.json.
"""

from __future__ import annotations

import aws_cdk as cdk

from eks_pd_serving import DeploymentConfig, PdServing

# In a real pipeline these come from the account request; each is validated before any
# construct is built, and a bad value stops synth with one line naming the setting.
TEAMS = {
    "search": DeploymentConfig.create(
        cluster_name="llm-search",
        endpoint_allowed_cidrs=["203.0.113.0/24"],
        admin_role_arn="arn:aws:iam::123456789012:role/SearchPlatformAdmin",
    ),
    "assist": DeploymentConfig.create(
        cluster_name="llm-assist",
        endpoint_allowed_cidrs=["198.51.100.0/24"],
        # Prefill is compute bound, decode memory-bandwidth bound: one L40S node for prefill,
        # three L4 nodes for decode.
        gpu_layout="per_phase",
        prefill_gpu_instance_type="g6e.8xlarge",
        prefill_gpu_node_count=1,
        decode_gpu_instance_type="g6.8xlarge",
        decode_gpu_node_count=3,
        decode_replicas=3,
        max_model_len=8192,
    ),
}


def main() -> None:
    app = cdk.App()
    for team, config in TEAMS.items():
        stack = cdk.Stack(app, f"LlmServing-{team}", description=f"PD LLM serving for {team}")
        PdServing(stack, "PdServing", config=config)
    app.synth()


if __name__ == "__main__":
    main()

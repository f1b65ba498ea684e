"""On-demand instance prices, USD per hour in us-east-1: what `cost` prices a deployment with and
`impact` a second Ray cluster's GPU nodes (NewCluster). Dated, with their source."""

from __future__ import annotations

PRICES_SOURCE = (
    "us-east-1 on-demand: instances from the AWS Pricing API as Karpenter recorded it on 2026-07-20, the rest "
    "from third-party price tables dated 2026 (cost.py)"
)
# USD per hour, us-east-1 on demand: aws/karpenter-provider-aws commit 6fc13b5236fd,
# pkg/providers/pricing/zz_generated.pricing_aws.go ("generated at 2026-07-20T13:44:30Z for
# us-east-1"). It has no on-demand price for p5e.48xlarge: `cost` says so on its line.
INSTANCE_PRICES: dict[str, float] = {
    "m5.xlarge": 0.192, "m5.2xlarge": 0.384, "m6i.xlarge": 0.192, "m6i.2xlarge": 0.384,
    "m7i.large": 0.1008, "m7i.xlarge": 0.2016, "m7i.2xlarge": 0.4032, "m7i.4xlarge": 0.8064,
    "g6.xlarge": 0.8048, "g6.2xlarge": 0.9776, "g6.4xlarge": 1.3232, "g6.8xlarge": 2.0144, "g6.12xlarge": 4.6016,
    "g6.16xlarge": 3.3968, "g6.24xlarge": 6.6752, "g6.48xlarge": 13.3504,
    "g6e.xlarge": 1.861, "g6e.8xlarge": 4.52856, "g6e.12xlarge": 10.49264, "g6e.24xlarge": 15.06559,
    "g6e.48xlarge": 30.13118,
    "g5.8xlarge": 2.448, "g5.12xlarge": 5.672, "g5.16xlarge": 4.096, "g5.24xlarge": 8.144, "g5.48xlarge": 16.288,
    "p4d.24xlarge": 21.957642, "p5.48xlarge": 55.04, "p5en.48xlarge": 63.296,
}  # fmt: skip

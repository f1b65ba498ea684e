"""Will the GPU node groups launch? The checks (``checks``) shared by `preflight` (your
credentials, before `cdk deploy`) and the deploy-time custom resource (``handler``, the stack's own
Lambda, before the EKS cluster); a Capacity Block's end (``block_end``, its scheduled function). This
folder is the Lambdas' code asset as it is: standard library and boto3 only."""

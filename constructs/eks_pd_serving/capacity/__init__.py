"""Will the GPU node groups launch? The checks shared by `preflight` (your credentials, before
`cdk deploy`) and the deploy-time custom resource (the stack's own Lambda, before the EKS
cluster). This folder is the Lambda's code asset as it is: standard library and boto3 only."""

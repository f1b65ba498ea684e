"""Small pure helpers the constructs share: the Helm release, KMS keys, the launch template,
published policies, Pod Identity, cdk-nag and checkov acknowledgments, the pods' programs. Never the
core translation (that is ``mapping``)."""

"""Small pure helpers the constructs share: the Helm release (``helm``), KMS keys (``kms``), the
launch template pieces (``launch_template``), the raw manifests (``manifests``), the Lambda functions
(``functions``), generated secrets (``secrets``), Pod Identity (``pod_identity``), the IAM policies
taken from upstream releases (``policies``), cdk-nag's and checkov's acknowledgments (``nag``,
``checkov``), the pods' programs as shipped (``pod_code``). Never the core translation (that is
``mapping``)."""

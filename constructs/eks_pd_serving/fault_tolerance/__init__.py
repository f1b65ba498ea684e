"""Ray head fault tolerance: the GCS store (``gcs_store``, ElastiCache for Valkey) and the head's
init container that hands the store's auth token to the Ray container (``auth``: pod-side code and
how it ships; no CloudFormation in it, so the cdk8s charts import it alone)."""

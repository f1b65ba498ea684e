"""Faults that no longer take the service down. Ray head fault tolerance: the GCS store
(``gcs_store``, ElastiCache for Valkey) and the head's init container that hands the store's auth
token to the Ray container (``auth``). The PD pair's failover (``failover``: each engine serves
through the other's loss) and decode's KV guard (``kv_guard``), and what a person does when one
fires (``runbook``). The pod-side code and how it ships has no CloudFormation in it, so the cdk8s
charts import it alone."""

"""Prefill/decode-disaggregated LLM serving on Amazon EKS, as AWS CDK constructs."""

"""The staging job's script (``stage``), run by CodeBuild as it is: standard library, boto3 and
huggingface_hub."""

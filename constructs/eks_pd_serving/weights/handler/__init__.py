"""The staging custom resource's Lambda (``handler``): starts the staging job, reports its end."""

"""Local CPU rehearsal of the deployed serve application (see README, `make rehearse`)."""

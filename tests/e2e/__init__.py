"""End-to-end tests: seed 001's acceptance scenarios on the full stack (`herald up`)."""

"""Fault injection on a full stack of its own (after tests/e2e has stopped its stack)."""

"""Runnable examples of Herald's upstream integration."""

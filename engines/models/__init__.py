"""Specs of the models the worker ships with (weights only from installed packages)."""

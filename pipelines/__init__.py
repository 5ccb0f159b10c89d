"""Runnable pipelines."""

"""PyramidSnapshot: the current featurization (sum of the live windows) as an artifact."""

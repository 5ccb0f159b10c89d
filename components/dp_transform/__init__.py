"""DP Transform: differentially private tf.Transform analyzers for Sage (Sage §3.1, List. 1)."""

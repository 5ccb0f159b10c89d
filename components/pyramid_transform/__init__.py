"""PyramidTransform: Examples -> Examples of count features, from a featurization snapshot."""

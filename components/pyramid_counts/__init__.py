"""PyramidCountTable: a granted window's blocks -> one sealed window of DP count tables."""

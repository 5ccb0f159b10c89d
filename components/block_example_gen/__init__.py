"""BlockExampleGen: reads the granted blocks (and only those) into a standard Examples artifact."""

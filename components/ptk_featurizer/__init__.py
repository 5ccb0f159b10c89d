"""PTKFeaturizer: featurizes Examples with a pinned PTK version, recording it (lineage)."""

"""PTKTrainer: trains one registered PTK on the granted blocks and writes the version to the lake.
"""

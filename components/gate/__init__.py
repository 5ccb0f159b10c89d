"""SageGate: asks the block ledger for a run's blocks and writes the decision as a SageGrant."""

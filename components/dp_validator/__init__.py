"""DPModelValidator: Sage's SLAed DP model validation (§3.3, List. 2) as a ModelBlessing."""

"""DP bagging §5 reproduction on an offline stand-in for the Heart Failure data.

``data`` (RAND HIE doctor contacts, person-level units), ``grid`` (Tables 1–2's grid),
``memory`` (the vote-memory benchmark). The scripts in ``benchmarks/bagging/`` call these.
"""

"""Differentially private bagging (Jordon, Yoon & van der Schaar, NeurIPS 2019) on the ledger.

k keyed-hash partitions of the privacy units into n chunks (``partition``), one teacher per chunk
(``teachers``), noisy plurality labels of public points and a student (``labelling``), the two
accountants (``accounting``: formally DP ``fixed_queries`` and the paper's personalised moments
accountant, reproduction only, behind an explicit non-DP opt-in), teachers cached per window
(``cache``: encrypted at rest with a per-window key wrapped in the ledger's database,
``encrypted``: authenticated before unpickling, shredded when the window retires), purchases
released once with the public cursor in the ledger (``purchase``). No TensorFlow at import.
The paper reproduction is ``sage_tfx.bagging.eval``.
"""
from sage_tfx.bagging.accounting import (PersonalisedMomentsAccountant, epsilon_of, max_queries,
                                         per_query_epsilon, queries_event, query_event)
from sage_tfx.bagging.cache import TeacherCache
from sage_tfx.bagging.cost import cost
from sage_tfx.bagging.labelling import (NON_DP_OPT_IN, LabellingResult, label_public, noisy_argmax,
                                        train_student)
from sage_tfx.bagging.partition import chunk_assignment
from sage_tfx.bagging.purchase import LABELS_RELEASE, MODEL_RELEASE, Purchase, buy_labels
from sage_tfx.bagging.run import (BaggingConfig, BaggingResult, LabelPlan, fit_dp_bagging,
                                  labels_from_grant, plan_labels)
from sage_tfx.bagging.teachers import TeacherEnsemble, train_teachers, vote_counts

__all__ = ["chunk_assignment", "TeacherEnsemble", "train_teachers", "vote_counts", "noisy_argmax",
           "label_public", "train_student", "LabellingResult", "per_query_epsilon", "query_event",
           "queries_event", "epsilon_of", "max_queries", "PersonalisedMomentsAccountant",
           "TeacherCache", "BaggingConfig", "BaggingResult", "LabelPlan", "fit_dp_bagging",
           "plan_labels", "labels_from_grant", "Purchase", "buy_labels", "LABELS_RELEASE",
           "MODEL_RELEASE", "NON_DP_OPT_IN"]
__all__ += ["cost"]

"""DP training algorithms of Sage's training pipelines (SOSP '19, Tab. 1).

* :mod:`sage_tfx.training.adassp` — linear regression by AdaSSP (Wang 2018), numpy only.
* :mod:`sage_tfx.training.logistic` — logistic regression by output perturbation
  (Chaudhuri et al. 2011), numpy only.
* :mod:`sage_tfx.training.keras_dpsgd` — DP-SGD (Abadi et al. 2016) for Keras models with
  TensorFlow Privacy's fast gradient clipping; imports TensorFlow only inside its functions.

The accounting of DP-SGD lives in :mod:`sage_tfx.dpsgd`. No module here imports TensorFlow at
import time.
"""

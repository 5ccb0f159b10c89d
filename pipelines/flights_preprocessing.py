"""DPTransform module of the flights DP pipeline: ``preprocessing_fn(inputs, epsilon)``.

Sage List. 1: the dataset statistics a Transform needs come from DP analyzers that together
spend exactly the plan's ``transform`` ε (DPTransform refuses an over- or under-spend and any
stock analyzer on a private feature). Here ε is split in three equal shares:

* ``distance_scaled`` = ``dp_scale_to_0_1(distance)``: scaled by a DP (min, max) found within the
  public bounds [0, 5000] miles;
* ``hour_scaled`` = ``dp_scale_to_0_1(hour)``: the same within [0, 24];
* ``dep_delay_centered`` = (``dep_delay`` clipped to the public [-60, 300] minutes − its DP
  mean) / 60, in hours from the mean (within ±6); a missing value (cancelled flight) is imputed
  with the DP mean (``dp_mean``, as List. 1), i.e. becomes 0. Centred rather than squeezed into
  [0, 1]: DP-SGD fits a feature of unit-ish spread far better under the same noise.

The label ``arr_delay`` is passed through unchanged (minutes; NaN where absent) and, for the
trainer, ``arr_delay_scaled`` = clip(arr_delay, -60, 300) / 300 (NaN where absent, so the trainer
drops unlabelled flights). The serving model applies this graph to raw examples without the
label (TFT prunes the label output then).

Input types. The hand-written schema (``flights_schema/schema.pbtxt``) gives no feature a shape,
so every input arrives as a SparseTensor (a column with missing values is one anyway), and the
integer columns (``distance``, ``hour``) are int64: :func:`dense_float` casts the values to
float32 and fills absent ones with an explicit default before any arithmetic.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import tensorflow as tf
import tensorflow_transform as tft

from sage_tfx.dp import mechanisms
from sage_tfx.components.dp_transform import analyzers as dp
from sage_tfx.pipelines import flights_plan as settings


def dense_float(x: Any, default: float) -> tf.Tensor:
    """A float32 [batch] tensor of one value per record, ``default`` where the value is absent.

    Accepts a SparseTensor (VarLenFeature, any numeric dtype, at most one value per record) or a
    dense [batch] / [batch, 1] tensor.
    """
    if isinstance(x, tf.SparseTensor):
        values = tf.cast(x.values, tf.float32)
        x = tft.sparse_tensor_to_dense_with_shape(
            tf.SparseTensor(x.indices, values, x.dense_shape), [None, 1],
            default_value=tf.constant(default, tf.float32))
    return tf.reshape(tf.cast(x, tf.float32), [-1])


def preprocessing_fn(inputs: Mapping[str, Any], epsilon: float) -> dict:
    """DP features of the flights delay task, spending exactly ``epsilon`` (see module doc).

    Args:
      inputs: raw features parsed with the flights schema (SparseTensors).
      epsilon: the plan's ``transform`` ε (DPTransform passes it).

    Returns:
      ``distance_scaled``, ``hour_scaled`` (float32 in [0, 1]), ``dep_delay_centered``
      (float32 hours from the DP mean) and ``arr_delay`` (float32 minutes, NaN if absent).
    """
    distance_share, hour_share, dep_share = mechanisms.split_budget(epsilon, 0.0, [1, 1, 1])
    lo_dist, hi_dist = settings.DISTANCE_BOUNDS
    lo_hour, hi_hour = settings.HOUR_BOUNDS
    lo_dep, hi_dep = settings.DEP_DELAY_BOUNDS

    distance = dense_float(inputs["distance"], lo_dist)
    hour = dense_float(inputs["hour"], lo_hour)
    distance_scaled = dp.dp_scale_to_0_1(distance, lo_dist, hi_dist, distance_share.epsilon,
                                         name="distance_scale")
    hour_scaled = dp.dp_scale_to_0_1(hour, lo_hour, hi_hour, hour_share.epsilon,
                                     name="hour_scale")

    # The mean of the present values only: the SparseTensor itself goes to the analyzer.
    dep_mean = dp.dp_mean(inputs["dep_delay"], lo_dep, hi_dep, dep_share.epsilon,
                          name="dep_delay_mean")
    dep_delay = dense_float(inputs["dep_delay"], math.nan)
    dep_delay = tf.where(tf.math.is_nan(dep_delay), dep_mean, dep_delay)
    dep_delay_centered = ((tf.clip_by_value(dep_delay, lo_dep, hi_dep) - dep_mean)
                          / settings.DEP_DELAY_SCALE)

    arr_delay = dense_float(inputs[settings.LABEL_KEY], math.nan)
    lo_label, hi_label = settings.LABEL_BOUNDS
    return {
        settings.DISTANCE_SCALED: distance_scaled,
        settings.HOUR_SCALED: hour_scaled,
        settings.DEP_DELAY_CENTERED: dep_delay_centered,
        settings.LABEL_KEY: arr_delay,
        # The trained label: NaN stays NaN (an unlabelled flight is not trained on).
        settings.ARR_DELAY_SCALED: tf.where(
            tf.math.is_nan(arr_delay), arr_delay,
            tf.clip_by_value(arr_delay, lo_label, hi_label) / settings.LABEL_SCALE),
    }

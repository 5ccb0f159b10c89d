"""A DP Transform module with seeded noise, so two runs on two Beam runners must agree exactly.

Seeds remove the privacy of the noise (a known seed is a known draw): tests only.
"""
import tensorflow as tf

from sage_tfx.components.dp_transform import analyzers as dp
from sage_tfx.dp import mechanisms
from sage_tfx.dp.noise import SeededNoise
from sage_tfx.pipelines.flights_preprocessing import dense_float


def preprocessing_fn(inputs, epsilon):
    """``distance`` scaled by a DP (min, max) and the DP mean of ``dep_delay``, ε split in two."""
    distance_share, dep_share = mechanisms.split_budget(epsilon, 0.0, [1, 1])
    distance = dense_float(inputs["distance"], 0.0)
    dep_mean = dp.dp_mean(inputs["dep_delay"], -60.0, 300.0, dep_share.epsilon,
                          noise=SeededNoise(2),
                          name="dep_delay_mean")
    return {
        "distance_scaled": dp.dp_scale_to_0_1(distance, 0.0, 5000.0, distance_share.epsilon,
                                              noise=SeededNoise(1), name="distance_scale"),
        "dep_delay_mean": tf.zeros_like(distance) + dep_mean,
    }

"""Module file of ``taxi_vocabulary_utility.py``: the DP taxi module with its vocabularies swapped.

``custom_config["vocabulary"]`` picks how ``payment_type`` and ``company`` become ids:

* ``dp`` — the module's own ``tft.compute_and_apply_vocabulary``: DP vocabularies by partition
  selection (``pipelines/taxi_utils_dp.py``, unchanged);
* ``hash`` — ``tf.strings.to_hash_bucket_fast`` into the same 1,010 ids (no analyzer, no δ);
* ``public`` — a declared public domain for ``payment_type`` (the City of Chicago's published
  payment types) and hashing for ``company`` (no public list of companies is at hand offline).

Everything else (z-scores, buckets, the label, ``model_fn``) is the module's.
"""
import tensorflow as tf

from sage_tfx.components.dp_transform import tft
from sage_tfx.pipelines import taxi_utils_dp as taxi

model_fn = taxi.model_fn

# Chicago's published payment types (the data portal's column description), not read from data.
PUBLIC_PAYMENT_TYPES = ("Cash", "Credit Card", "No Charge", "Unknown", "Dispute", "Pcard",
                        "Prcard", "Mobile", "Prepaid", "Split", "Way2ride")
_IDS = taxi._VOCAB_SIZE + taxi._OOV_SIZE  # pylint: disable=protected-access


def _hashed(x):
    return tf.strings.to_hash_bucket_fast(x, _IDS)


def _public(x):
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(list(PUBLIC_PAYMENT_TYPES),
                                            tf.range(len(PUBLIC_PAYMENT_TYPES), dtype=tf.int64)),
        default_value=-1)
    ids = table.lookup(x)
    return tf.where(ids >= 0, ids, len(PUBLIC_PAYMENT_TYPES) + _hashed(x) % taxi._OOV_SIZE)


def preprocessing_fn(inputs, custom_config):
    """The module's preprocessing_fn, its two vocabularies made as ``vocabulary`` says."""
    mode = (custom_config or {}).get("vocabulary", "dp")
    if mode == "dp":
        return taxi.preprocessing_fn(inputs)
    fill = taxi._fill_in_missing  # pylint: disable=protected-access
    name = taxi._transformed_name  # pylint: disable=protected-access
    outputs = {}
    for key in taxi._DENSE_FLOAT_FEATURE_KEYS:  # pylint: disable=protected-access
        outputs[name(key)] = tft.scale_to_z_score(fill(inputs[key]), **taxi._BOUNDS[key])
    for key in taxi._VOCAB_FEATURE_KEYS:  # pylint: disable=protected-access
        x = fill(inputs[key])
        outputs[name(key)] = (_public(x) if mode == "public" and key == "payment_type"
                              else _hashed(x))
    for key in taxi._BUCKET_FEATURE_KEYS:  # pylint: disable=protected-access
        outputs[name(key)] = tft.bucketize(fill(inputs[key]), taxi._FEATURE_BUCKET_COUNT,
                                           **taxi._BOUNDS[key])
    for key in taxi._CATEGORICAL_FEATURE_KEYS:  # pylint: disable=protected-access
        outputs[name(key)] = fill(inputs[key])
    fare, tips = fill(inputs[taxi._FARE_KEY]), fill(inputs[taxi._LABEL_KEY])
    outputs[name(taxi._LABEL_KEY)] = tf.where(
        tf.math.is_nan(fare), tf.cast(tf.zeros_like(fare), tf.int64),
        tf.cast(tf.greater(tips, tf.multiply(fare, tf.constant(0.2))), tf.int64))
    return outputs

"""The DP Trainer's privacy loop: the executor trains the user's model itself (Sage §3.1).

Opacus-style: a run_fn hands the executor its objects — Keras layers, loss, optimizer, the
training rows — and gets back their private version, trained by the executor with exactly the
DP-SGD run (or the AdaSSP release) that spends the plan's ``train`` part::

    def run_fn(fn_args):
        training = run_fn_utils.private_training(fn_args)
        data = run_fn_utils.read_split(fn_args, "train", columns, label_key="y")
        model = training.dpsgd(layers, data.features, data.labels,
                               loss=tf.keras.losses.MeanSquaredError(), batch_size=256,
                               epochs=5, l2_norm_clip=1.0, learning_rate=0.05)
        run_fn_utils.export_serving_model(fn_args, model, columns, kinds=data.kinds)

After the run_fn returns, the executor takes from this object what ran
(:meth:`PrivateTraining.record`, a ``guarantee.TrainingRecord``) and verifies the charge from it
alone. It refuses (``guarantee.UnverifiedTrainingError``) and publishes nothing when

* no training ran through this object (a run_fn that trained plain Keras, or called a DP
  algorithm itself), or more than one did (the part pays for one);
* DP-SGD: the noisy aggregations counted inside the training step are not the accounted steps
  (a second ``fit`` of the private model is counted too), or a step added noise of another std
  than σ·C;
* the exported serving model's trainable variables are not exactly the weights this training
  produced (:meth:`PrivateTraining.check_exported`): another model trained beside it, or these
  weights trained further without DP. Post-processing belongs in the serving function, not in
  the weights. Nor may it carry the DP noise generator's state (its key and counter regenerate
  every noise draw of the run).

What it cannot see: a run_fn is Python in the executor's process and could subvert anything
(monkey-patching TensorFlow); the checks catch a run_fn that trains outside the privacy loop,
not one written to defeat them.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Any, Iterator, Optional, Sequence

import numpy as np

from sage_tfx.adaptive import plan as plan_lib
from sage_tfx.components.dp_trainer import guarantee as guarantee_lib
from sage_tfx.dp import dpsgd as dpsgd_lib
from sage_tfx.errors import InvalidPrivacyParameterError, MissingGrantError
from sage_tfx.ledger import accounting

_ACTIVE: contextvars.ContextVar[Optional["PrivateTraining"]] = contextvars.ContextVar(
    "sage_tfx_private_training", default=None)


def current() -> "PrivateTraining":
    """The privacy loop of the DPTrainer run in progress.

    Raises:
      MissingGrantError: called outside a DPTrainer run (no plan part to spend).
    """
    training = _ACTIVE.get()
    if training is None:
        raise MissingGrantError(
            "no DPTrainer run is in progress: DP training runs inside the DPTrainer executor, "
            "which spends the plan's train part of a SageGrant")
    return training


def weight_values(arrays: Sequence[Any]) -> np.ndarray:
    """All values of ``arrays`` as one sorted float32 vector: the model's weights, whatever the
    layout of its variables (a linear model's (d, 1) kernel and bias, or AdaSSP's d + 1 vector)."""
    flat = [np.asarray(a, dtype=np.float32).ravel() for a in arrays]
    return np.sort(np.concatenate(flat)) if flat else np.zeros(0, np.float32)


def exported_variables(saved_model_dir: str) -> tuple[np.ndarray, list]:
    """(:func:`weight_values` of the trainable variables, every variable value) of a SavedModel,
    read from its files.

    The SavedModel's object graph says which variables are trainable; the checkpoint beside it
    (``variables/``) holds their values, under the keys of its own object graph (same node ids).
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2, trackable_object_graph_pb2

    saved = saved_model_pb2.SavedModel()
    with tf.io.gfile.GFile(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    nodes = saved.meta_graphs[0].object_graph_def.nodes
    trainable = [i for i, node in enumerate(nodes)
                 if node.WhichOneof("kind") == "variable" and node.variable.trainable]
    prefix = os.path.join(saved_model_dir, "variables", "variables")
    if not tf.io.gfile.exists(prefix + ".index"):
        return weight_values([]), []
    reader = tf.train.load_checkpoint(prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    values = []
    for i in trainable:
        [key] = [a.checkpoint_key for a in graph.nodes[i].attributes
                 if a.name == "VARIABLE_VALUE"]
        values.append(reader.get_tensor(key))
    everything = [reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
                  if k != "_CHECKPOINTABLE_OBJECT_GRAPH"]
    return weight_values(values), everything


class PrivateTraining:
    """The executor's DP training of one DPTrainer run, and the record of what it ran.

    Args:
      part: The plan's train part the run spends.
      num_train_records: Records the executor counted in the train split(s).
      report_delta: rdp parts: the δ at which ε is reported.
    """

    def __init__(self, part: plan_lib.PlanPart, *, num_train_records: int,
                 report_delta: Optional[float] = None):
        self._part = part
        self._num_train_records = int(num_train_records)
        self._report_delta = report_delta
        self._algorithm: Optional[str] = None
        self._dpsgd: Optional[tuple] = None       # (model, DPSGDRun)
        self._record: Optional[guarantee_lib.TrainingRecord] = None
        self._weights: Optional[np.ndarray] = None
        self._secrets: list = []                   # state that must never leave (noise RNG)

    @contextlib.contextmanager
    def active(self) -> Iterator["PrivateTraining"]:
        """Makes this the loop :func:`current` returns (while the executor runs the run_fn)."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    def _check_rows(self, num_examples: int) -> None:
        if num_examples > self._num_train_records:
            raise InvalidPrivacyParameterError(
                f"num_examples={num_examples} exceeds the {self._num_train_records} records of "
                "the train split")

    def _claim(self, algorithm: str) -> None:
        if self._algorithm is not None:
            raise guarantee_lib.UnverifiedTrainingError(
                f"this run already trained with {self._algorithm}: the plan's train part pays "
                "for one training run")
        self._algorithm = algorithm

    # --- DP-SGD ---------------------------------------------------------------------------------

    def plan_dpsgd(self, num_examples: int, *, batch_size: int, epochs: float,
                   l2_norm_clip: float, accountant: str = dpsgd_lib.DEFAULT_ACCOUNTANT
                   ) -> guarantee_lib.DPSGDRun:
        """The DP-SGD run that spends the part on ``num_examples`` rows (nothing runs).

        basic parts: σ calibrated to the part's (ε, δ) for ``batch_size`` / ``epochs`` over the
        real n; rdp parts: σ, q and the steps are the event's (``batch_size`` / ``epochs`` /
        ``accountant`` ignored). See ``guarantee.dpsgd_run_for_part``.

        Raises:
          GuaranteeMismatchError, InvalidPrivacyParameterError: a part DP-SGD cannot spend, or
            more rows than the train split holds.
        """
        self._check_rows(num_examples)
        return guarantee_lib.dpsgd_run_for_part(
            self._part, num_examples=num_examples, batch_size=batch_size, epochs=epochs,
            l2_norm_clip=l2_norm_clip, accountant=accountant, report_delta=self._report_delta)

    def dpsgd(self, layers: Any, features: Any, labels: Any, *, loss: Any, batch_size: int,
              epochs: float, l2_norm_clip: float, optimizer: Any = None,
              learning_rate: float = 0.01, accountant: str = dpsgd_lib.DEFAULT_ACCOUNTANT,
              metrics: Optional[Sequence[Any]] = None, seed: Optional[int] = None) -> Any:
        """Trains ``layers`` privately on the rows with the part's DP-SGD run; the trained model.

        Exactly :meth:`plan_dpsgd`'s steps, each on a Poisson-sampled batch (every row
        independently with the accounted q, padded and masked to one shape), the clipped
        gradient sum plus N(0, (σC)²) divided by the expected batch size
        (``sage_tfx.dp.keras_dpsgd.make_poisson_dp_model``, TF Privacy's fast clipping, one
        example per microbatch). Nothing is printed or logged: training metrics are not DP.

        Args:
          layers: Keras layers, or a zero-argument callable returning them.
          features: (n, d) float array, n ≤ the train split's records.
          labels: (n,) or (n, k) array.
          loss: A ``tf.keras.losses.Loss`` instance.
          batch_size, epochs, l2_norm_clip, accountant: As in :meth:`plan_dpsgd`.
          optimizer: A standard Keras optimizer (never a DP one); default SGD(learning_rate).
          learning_rate: For the default optimizer.
          metrics: Keras metrics (computed, never written anywhere).
          seed: Seeds the initial weights only; noise and sampling always use OS entropy.

        Returns:
          The trained ``PoissonDPSequential``.

        Raises:
          UnverifiedTrainingError: this run already trained a model.
          GuaranteeMismatchError, InvalidPrivacyParameterError, ValueError: a part DP-SGD
            cannot spend, bad rows, layers or loss.
        """
        from sage_tfx.dp import keras_dpsgd
        x, y = keras_dpsgd.check_data(features, labels)
        run = self.plan_dpsgd(int(x.shape[0]), batch_size=batch_size, epochs=epochs,
                              l2_norm_clip=l2_norm_clip, accountant=accountant)
        self._claim(guarantee_lib.DPSGD)
        tf, _, _ = keras_dpsgd.import_tf_privacy()
        if seed is not None:
            tf.keras.utils.set_random_seed(int(seed))
        q = run.sampling_probability  # the accounted q itself (rdp: the event's, not batch / n)
        model = keras_dpsgd.make_poisson_dp_model(
            layers, input_shape=x.shape[1:], l2_norm_clip=run.l2_norm_clip,
            noise_multiplier=run.noise_multiplier, expected_batch_size=q * run.num_examples)
        keras_dpsgd.compile_dp(model, loss=loss, optimizer=optimizer,
                               learning_rate=learning_rate, metrics=metrics)
        model.fit(keras_dpsgd.poisson_batches(x, y, q, run.steps), epochs=1, verbose=0)
        self._dpsgd = (model, run)
        # pylint: disable-next=protected-access
        self._secrets = [model._noise_rng.state.numpy()]
        self._weights = weight_values([v.numpy() for v in model.trainable_variables])
        self._dpsgd_record()  # fails now if the loop did not run exactly the accounted steps
        return model

    def _dpsgd_record(self) -> guarantee_lib.TrainingRecord:
        """What the private model's step ran, read from its in-graph counters."""
        model, run = self._dpsgd
        steps, low, high = model.noisy_aggregations()
        if steps != run.steps:
            raise guarantee_lib.UnverifiedTrainingError(
                f"the private model ran {steps} noisy DP-SGD steps but the plan accounts "
                f"{run.steps}: train it once, with training.dpsgd(...), and never again")
        # pylint: disable-next=protected-access
        clip, sigma = float(model._l2_norm_clip), float(model._noise_multiplier)
        # The sampler draws with σ·C in the weights' dtype (float32: within 2⁻²⁴ relative).
        dtype = model.trainable_variables[0].dtype.as_numpy_dtype
        std = float(np.asarray(clip * sigma, dtype=dtype))
        if not low == high == std:
            raise guarantee_lib.UnverifiedTrainingError(
                f"the DP-SGD steps added noise of std in [{low}, {high}], not "
                f"noise_multiplier × l2_norm_clip = {std}")
        return guarantee_lib.TrainingRecord(
            algorithm=guarantee_lib.DPSGD, noise_multiplier=sigma,
            num_examples=run.num_examples, accountant=run.accountant, l2_norm_clip=clip,
            sampling_probability=run.sampling_probability, steps=steps,
            batch_size=run.batch_size, epochs=run.epochs)

    # --- AdaSSP ---------------------------------------------------------------------------------

    def adassp(self, features: Any, labels: Any, *, x_bound: float, y_bound: float,
               rho: Optional[float] = None, accountant: str = dpsgd_lib.PLD) -> Any:
        """DP linear regression by AdaSSP (``sage_tfx.dp.adassp``) at the part's (ε, δ).

        The project's own code draws the noise (OpenDP); σ is calibrated to the part, and the
        record holds the σ the three releases drew with.

        Returns:
          The ``AdaSSPResult`` (weights: the model; export exactly them).

        Raises:
          InvalidPrivacyParameterError: an rdp part (AdaSSP calibrates σ from (ε, δ) and cannot
            spend a given event exactly) or δ = 0, checked before any row is read; too many
            rows.
          UnverifiedTrainingError: this run already trained a model.
        """
        from sage_tfx.dp import adassp as adassp_lib
        part = self._part
        if part.mode != accounting.BASIC:
            raise InvalidPrivacyParameterError(
                f"AdaSSP can only spend a basic (epsilon, delta) train part; this plan's train "
                f"part is the DpEvent {part.event}. Use DP-SGD for rdp streams.")
        if not part.delta:
            raise InvalidPrivacyParameterError(
                f"the plan's train part has delta={part.delta!r}; AdaSSP uses Gaussian noise and "
                "needs delta > 0")
        x = np.asarray(features, dtype=np.float64)
        self._check_rows(len(x))
        self._claim(guarantee_lib.ADASSP)
        result = adassp_lib.adassp(
            x, labels, epsilon=float(part.epsilon), delta=float(part.delta), x_bound=x_bound,
            y_bound=y_bound, rho=adassp_lib.DEFAULT_RHO if rho is None else rho,
            accountant=accountant)
        self._record = guarantee_lib.TrainingRecord(
            algorithm=guarantee_lib.ADASSP, noise_multiplier=float(result.noise_multiplier),
            num_examples=int(x.shape[0]), accountant=result.accountant)
        self._weights = weight_values([result.weights])
        return result

    # --- what ran -------------------------------------------------------------------------------

    def record(self) -> guarantee_lib.TrainingRecord:
        """What the run's one training ran (DP-SGD: the counters read again, now).

        Raises:
          UnverifiedTrainingError: no training ran through this object, or the private model
            ran other steps than accounted.
        """
        if self._dpsgd is not None:
            return self._dpsgd_record()
        if self._record is not None:
            return self._record
        raise guarantee_lib.UnverifiedTrainingError(
            "no DP training ran through the executor's privacy loop: train with "
            "run_fn_utils.private_training(fn_args).dpsgd(...) (or .adassp(...)). A model the "
            "run_fn trained by itself (plain Keras, a DP algorithm called directly) has no "
            "verified privacy and is not published, whatever the run_fn reports")

    def check_exported(self, serving_model_dir: str) -> None:
        """The exported model's trainable variables must be exactly the trained weights, and it
        must not carry the noise generator's state.

        Raises:
          UnverifiedTrainingError: they are not, it does, or nothing was trained.
        """
        self.record()
        exported, everything = exported_variables(serving_model_dir)
        for secret in self._secrets:
            if any(v.shape == secret.shape and np.array_equal(v, secret) for v in everything):
                raise guarantee_lib.UnverifiedTrainingError(
                    f"the exported model {serving_model_dir} carries the state of the DP noise "
                    "generator: anyone holding it could regenerate the noise and subtract it. "
                    "Export a copy without the training state (run_fn_utils."
                    "export_serving_model does)")
        if not np.array_equal(exported, self._weights):
            raise guarantee_lib.UnverifiedTrainingError(
                f"the exported model {serving_model_dir} is not the model the executor's DP "
                f"training produced: its {exported.size} trainable values are not the "
                f"{self._weights.size} trained ones. Export the model training.dpsgd(...) "
                "returned (or AdaSSP's weights), unchanged")

"""Knowledge distillation, after https://keras.io/examples/vision/knowledge_distillation/.

The example's `Distiller(keras.Model)`: no `call`, its own `compile` (a student
loss, a distillation loss, `alpha`, `temperature`), a `train_step` that updates
the student's weights only and logs `student_loss` and `distillation_loss`, a
`test_step` that logs `student_loss`; a convolutional teacher trained first as
usual, then distilled into a smaller student. Keras 3 has no
`compiled_metrics`: the steps update and read the compiled metrics with
`compute_metrics` (which every Keras 3 release from 3.0 has). Here on 12x12 random
"digits", one epoch of teacher training, fewer filters.
"""

from __future__ import annotations

import functools

import keras
import numpy as np
import tensorflow as tf
from keras import layers

NUM_CLASSES = 10
INPUT_SHAPE = (12, 12, 1)
ROWS, BATCH_SIZE, EPOCHS = 256, 32, 2


class Distiller(keras.Model):
    def __init__(self, student, teacher):
        super().__init__()
        self.teacher = teacher
        self.student = student

    def compile(self, optimizer, metrics, student_loss_fn, distillation_loss_fn, alpha=0.1,
                temperature=3, **kwargs):
        """`alpha` weighs the student loss, `1 - alpha` the distillation loss; a higher
        `temperature` softens both probability distributions. Other arguments go to Keras's
        `compile` (`steps_per_execution`, in tests/fit_settings_scenarios.py)."""
        super().compile(optimizer=optimizer, metrics=metrics, **kwargs)
        self.student_loss_fn = student_loss_fn
        self.distillation_loss_fn = distillation_loss_fn
        self.alpha = alpha
        self.temperature = temperature

    def train_step(self, data):
        x, y = data
        teacher_predictions = self.teacher(x, training=False)
        with tf.GradientTape() as tape:
            student_predictions = self.student(x, training=True)
            student_loss = self.student_loss_fn(y, student_predictions)
            distillation_loss = self.distillation_loss_fn(
                tf.nn.softmax(teacher_predictions / self.temperature, axis=1),
                tf.nn.softmax(student_predictions / self.temperature, axis=1),
            ) * self.temperature**2
            loss = self.alpha * student_loss + (1 - self.alpha) * distillation_loss
        trainable_vars = self.student.trainable_variables  # the teacher stays as it is
        gradients = tape.gradient(loss, trainable_vars)
        self.optimizer.apply_gradients(zip(gradients, trainable_vars, strict=True))
        results = self.compute_metrics(x, y, student_predictions, sample_weight=None)
        results.update({"student_loss": student_loss, "distillation_loss": distillation_loss})
        return results

    def test_step(self, data):
        x, y = data
        y_prediction = self.student(x, training=False)
        student_loss = self.student_loss_fn(y, y_prediction)
        results = self.compute_metrics(x, y, y_prediction, sample_weight=None)
        results.update({"student_loss": student_loss})
        return results


@functools.lru_cache(maxsize=1)
def _arrays() -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(17)
    x = rng.uniform(size=(ROWS, *INPUT_SHAPE)).astype("float32")
    y = rng.integers(0, NUM_CLASSES, size=ROWS)
    x_test = rng.uniform(size=(64, *INPUT_SHAPE)).astype("float32")
    y_test = rng.integers(0, NUM_CLASSES, size=64)
    return x, y, x_test, y_test


def data() -> dict:
    x, y, x_test, y_test = _arrays()
    return {"fit": (x, y), "fit_kwargs": {"batch_size": BATCH_SIZE, "epochs": EPOCHS},
            "evaluate": {"x": x_test, "y": y_test, "batch_size": BATCH_SIZE}}


def _convnet(filters, name):
    return keras.Sequential(
        [
            keras.Input(shape=INPUT_SHAPE),
            layers.Conv2D(filters[0], (3, 3), strides=(2, 2), padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.MaxPooling2D(pool_size=(2, 2), strides=(1, 1), padding="same"),
            layers.Conv2D(filters[1], (3, 3), strides=(2, 2), padding="same"),
            layers.Flatten(),
            layers.Dense(NUM_CLASSES),
        ],
        name=name,
    )


def build(optimizer: str = "program") -> keras.Model:
    keras.utils.set_random_seed(3)
    teacher = _convnet((16, 32), "teacher")  # (256, 512) in the example
    student = _convnet((4, 8), "student")  # (16, 32) in the example
    teacher.compile(optimizer=keras.optimizers.Adam(),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                    metrics=[keras.metrics.SparseCategoricalAccuracy()])
    x, y, _, _ = _arrays()
    teacher.fit(x, y, batch_size=BATCH_SIZE, epochs=1, shuffle=False, verbose=0)
    distiller = Distiller(student=student, teacher=teacher)
    distiller.compile(
        optimizer=keras.optimizers.Adam() if optimizer == "program" else keras.optimizers.SGD(0.05),
        metrics=[keras.metrics.SparseCategoricalAccuracy()],
        student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        distillation_loss_fn=keras.losses.KLDivergence(),
        alpha=0.1,
        temperature=10,
    )
    return distiller

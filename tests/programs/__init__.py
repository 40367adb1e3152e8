"""keras.io example programs, rewritten small, to train under `@kmp.parallelize`.

Each module follows one keras.io example: the model code (custom layers, `Model`
subclasses, the compile arguments) as its author wrote it where Keras 3 allows, on
seeded synthetic data of small shapes, with dropout 0, no shuffling and seeded
initialisers, so one device and several devices must end on the same weights.

A module exposes:
    `data()`: the inputs, as a dict with `"fit"` (the arrays or dataset `fit` takes
        first), `"fit_kwargs"` (the rest of the `fit` call, validation included) and
        `"evaluate"` (the arguments of the final `evaluate`).
    `build(optimizer="program")`: the compiled model; `"program"` is the
        example's own optimizer, `"sgd"` plain SGD.
    `callbacks(directory, parallel)` (optional): the example's callbacks, kmp's
        drop-ins when `parallel` (README.md, "Adapt your project").
    `after_fit(model, directory)` (optional): what the example does between `fit`
        and `evaluate` (loading its best checkpoint).

`tests/programs/harness.py` trains them; `tests/integration/test_keras_io_programs.py`
compares one device with 2 devices and 2 workers.
"""

#: Keras 3 programs written for the JAX backend (or any backend) by others, run by
#: `tests/jax/programs.py`: their `data()` also has `"predict"`; `LARGE = True` marks a
#: large-model program (also trained with `strategy="model_parallel"`, with its
#: `layout_map()` where it has one). They import no TensorFlow.
JAX_PROGRAMS = ("jax_custom_train_step", "jax_image_classifier", "jax_miniature_gpt",
                "jax_hub_text_classifier", "jax_hub_gemma", "jax_distribution_guide")

PROGRAMS = ("mnist_convnet", "vision_transformer", "knowledge_distillation",
            "text_transformer", "feature_space")
OPTIMIZERS = ("sgd", "program")

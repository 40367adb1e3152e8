"""Parameter-server training for Keras 3 on TensorFlow (`strategy="parameter_server"`).

Keras 3's `Model.fit` refuses TensorFlow's `ParameterServerStrategy`
(keras-team/keras#18624). kmp trains such a model with TensorFlow's own machinery
(`ParameterServerStrategy`, `ClusterCoordinator`): the variables live on the
parameter servers (large ones split over them), the chief runs the user's script and
sends the model's steps to the workers, which train asynchronously.

- `cluster`: the chief's strategy and coordinator; the servers of the workers and
  parameter servers;
- `data`: `fit`'s input made for the workers (NumPy rows per closure, or per-worker
  datasets);
- `steps`: the closures sent to the workers, and the window of those in flight;
- `fit`: `model.fit` (and `train_on_batch`) with Keras's `CallbackList` on the chief;
- `inline`: `evaluate` and `predict` on the chief;
- `report`: the placement of the variables over the parameter servers
  (`kmp.placement_report`).

The Keras methods are dispatched here by the `kmp.compat` record
`parameter_server_methods` (`backends/tensorflow/patches/parameter_server.py`), for the
models of a parameter-server strategy only.
"""

"""The TensorFlow backend's changes to Keras and TensorFlow behaviour, one module per area.

Each is a record of the registry (`kmp.compat.PATCHES`, `keras_mgpu_plugins/compat/_table.py`):
upstream issue, version range, the symptom it fixes, its order and its undo.
"""

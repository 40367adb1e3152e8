"""Promises every lane keeps: the same test code on TensorFlow, JAX and torch (each lane's
environment runs this folder with its `KERAS_BACKEND`), multi-process cases through
`kmp.launch`."""

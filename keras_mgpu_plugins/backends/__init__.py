"""One folder per Keras backend: what kmp does with that backend's own distribution API.

The rest of the package is backend-free and reaches a backend through `kmp.runtime`.
"""

"""What the JAX lane's private uses need of JAX and of Keras's JAX backend (their checks:
nothing to check where JAX is not installed)."""

from __future__ import annotations

from keras_mgpu_plugins.compat import _names
from keras_mgpu_plugins.errors import UncheckedVersionError


def check_jax_client() -> list[str]:
    """What `jax_coordination_client` needs of JAX's distributed runtime client."""
    import importlib.util

    if importlib.util.find_spec("jax") is None:
        return []
    try:
        state = _names.resolve("jax distributed").global_state
        client_type = importlib.import_module("jax._src.lib")._jax.DistributedRuntimeClient
    except (ImportError, AttributeError, UncheckedVersionError) as err:
        return [f"jax distributed.global_state cannot be found ({err})"]
    missing = [name for name in ("key_value_set", "key_value_dir_get", "key_value_try_get")
               if not hasattr(client_type, name)]
    return ([] if hasattr(state, "client") else ["global_state.client is gone"]) + [
        f"DistributedRuntimeClient.{name} is gone" for name in missing]


def check_jax_variable() -> list[str]:
    """What `jax_variable_relayout` needs of Keras's JAX variable."""
    import importlib.util

    if importlib.util.find_spec("jax") is None:
        return []
    try:
        variable = _names.resolve("jax variable")
    except UncheckedVersionError as err:
        return [f"jax variable cannot be found ({err})"]
    return [f"JaxVariable.{name} is gone" for name in ("_direct_assign", "_initialize_layout")
            if not callable(getattr(variable, name, None))]

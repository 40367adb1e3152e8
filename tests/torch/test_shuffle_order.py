"""kmp's shuffled order of arrays on torch is the one Keras's own torch `DataLoader` draws on
one device, from torch's global generator (`backends.torch.feeding.torch_order`)."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("mode", [True, "batch"])
def test_torch_order_is_what_keras_dataloader_draws(mode):
    import torch
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter

    from keras_mgpu_plugins.backends.torch.feeding import torch_order

    torch.manual_seed(3)
    adapter = ArrayDataAdapter(np.arange(20), batch_size=8, shuffle=mode)
    batches = list(adapter.get_torch_dataloader())
    keras_rows = np.concatenate([np.asarray(b[0] if isinstance(b, (tuple, list)) else b)
                                 .reshape(-1) for b in batches])
    after_keras = int(torch.randint(1 << 30, ()).item())
    torch.manual_seed(3)
    torch.empty((), dtype=torch.int64).random_()  # the base seed of kmp's own DataLoader
    mine = torch_order(20, 8, mode)
    assert mine.tolist() == keras_rows.tolist()
    assert int(torch.randint(1 << 30, ()).item()) == after_keras  # the state advanced alike

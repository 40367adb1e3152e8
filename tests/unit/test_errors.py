"""kmp's exceptions cross process boundaries whole (Ray Train pickles a worker's exception to its
controller; multiprocessing and the launcher do the same)."""

from __future__ import annotations

import pickle

import cloudpickle

from keras_mgpu_plugins.errors import STOPPED_EXIT_CODE, TrainingStopped


def test_training_stopped_is_rebuilt_with_every_attribute_when_unpickled():
    stop = TrainingStopped("kmp: stopped by SIGTERM", signal="SIGTERM", saved=True,
                           code=STOPPED_EXIT_CODE, epoch=2, batches_done=1,
                           backup_dir="/shared/backup", received=False)
    for dumps in (pickle.dumps, cloudpickle.dumps):
        again = pickle.loads(dumps(stop))
        assert type(again) is TrainingStopped and again.record() == stop.record()
        assert str(again) == "kmp: stopped by SIGTERM" and again.code == 75

"""The launcher's default output leaves the backends' runtime log lines to the log files
(`launch._quiet`): TensorFlow's C++ logs with the lines they continue, absl's notice, Gloo's
lines; never a line of the user's, never a fatal C++ line."""

from __future__ import annotations

import io
import os

import pytest

from keras_mgpu_plugins.launch import _process
from keras_mgpu_plugins.launch._quiet import RuntimeLines

#: What worker 0 of a 2-worker TensorFlow quickstart printed on stderr before (kmp 0.1.0.dev0,
#: TensorFlow 2.21; the user's and Keras's lines between them).
TENSORFLOW = """\
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1795925439.320023    7813 port.cc:153] oneDNN custom operations are on. You may see slightly different numerical results due to floating-point round-off errors from different computation orders. To turn them off, set the environment variable `TF_ENABLE_ONEDNN_OPTS=0`.
I0000 00:00:1795925439.325455    7813 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.
I0000 00:00:1795925439.450104    7813 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use available CPU instructions in performance-critical operations.
To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 AVX512_FP16 AVX_VNNI AMX_TILE AMX_INT8 AMX_BF16 FMA, in other operations, rebuild TensorFlow with the appropriate compiler flags.
E0000 00:00:1795925446.073786    7813 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)
I0000 00:00:1795925446.148443    7813 coordination_service.cc:221] Initializing CoordinationService
I0000 00:00:1795925446.148864    7813 grpc_server_lib.cc:467] Started server with target: grpc://localhost:57019
I0000 00:00:1795925446.256330    8856 coordination_service.h:529] /job:worker/replica:0/task:0 has connected to coordination service. Incarnation: 11244859921437729613
I0000 00:00:1795925446.256376    8856 coordination_service.cc:502] Waiting for 1/2 tasks to connect.
I0000 00:00:1795925446.256385    8856 coordination_service.cc:505] Example stragglers:
/job:worker/replica:0/task:1
I0000 00:00:1795925446.260625    7813 coordination_service_agent.cc:245] Coordination agent has successfully connected.
I0000 00:00:1795925446.347837    8856 coordination_service.cc:1472] Barrier(WaitForAllTasks::17393055145691914304::0) has passed with status: OK
W0000 00:00:1795925447.242556    7813 dataset.cc:997] Input of GeneratorDatasetOp::Dataset will not be optimized because the dataset does not implement the AsGraphDefInternal() method needed to apply optimizations.
[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1
""".splitlines()
USER = ["Training on 2 replicas (Keras backend: tensorflow), global batch 64",
        "/job:worker/replica:0/task:1",  # the user's own line: no C++ line before it
        "Traceback (most recent call last):",
        "F0000 00:00:1795925447.242556    7813 check.cc:12] Check failed: fatal",
        "To enable the following instructions: this is the user's"]


def test_runtime_lines_are_recognised_and_the_users_are_not():
    lines = RuntimeLines()
    assert [line for line in TENSORFLOW if not lines.hides(line)] == []
    assert [line for line in USER if lines.hides(line)] == []


def test_a_continuation_counts_only_right_after_a_runtime_line():
    lines = RuntimeLines()
    assert lines.hides(TENSORFLOW[10]) and lines.hides("/job:worker/replica:0/task:1")
    assert not lines.hides("Epoch 1/2") and not lines.hides("/job:worker/replica:0/task:1")


class _Pipe(io.BytesIO):
    pass


@pytest.mark.parametrize("quiet", [True, False])
def test_the_relay_keeps_every_line_in_the_log_and_shows_the_runtimes_only_when_asked(
        tmp_path, capsys, quiet):
    text = "\n".join([*TENSORFLOW, "Epoch 1/2", "done"]) + "\n"
    log = tmp_path / "worker-0.log"
    _process._relay(_Pipe(text.encode()), "worker 0", "stderr", (), str(log), True, quiet)
    shown = capsys.readouterr().err.splitlines()
    assert log.read_text() == text  # the log file: all of it
    expected = ["Epoch 1/2", "done"] if quiet else [*TENSORFLOW, "Epoch 1/2", "done"]
    assert shown == [f"[worker 0] {line}" for line in expected]
    assert os.path.getsize(log) > 0

"""Real models as their authors publish them (tests/models/README.md), against onnxruntime."""

from pathlib import Path

import numpy as np
import pytest

import fastlayers

from ..conftest import assert_close, oracle

MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.mark.parametrize("rate,chunk", [(16000, 512), (8000, 256)])
def test_silero_vad_streams_like_onnxruntime(rng, rate, chunk):
    """Silero's voice-activity detector: an If on the sample-rate input picks the 8 kHz or
    16 kHz branch (STFT as a convolution, encoder, LSTM decoder); its state is carried from
    chunk to chunk, as its users stream audio."""
    ort = oracle("onnxruntime")
    path = MODELS / "silero_vad_16k_op15.onnx"
    ours = fastlayers.load(path)
    assert "If" in ours.op_types  # decided per call, by the sr input
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    state_ours = state_theirs = np.zeros((2, 2, 128), np.float32)
    sr = np.array(rate, np.int64)
    for step in range(3):
        audio = (rng.standard_normal((2, chunk)) * (0.05 + 0.2 * step)).astype(np.float32)
        prob, state_theirs = theirs.run(None, {"input": audio, "state": state_theirs, "sr": sr})
        got, state_ours = ours.run(None, {"input": audio, "state": state_ours, "sr": sr})
        assert_close(got, prob, rtol=1e-4, atol=1e-6, what=f"speech probability, chunk {step}")
        assert_close(state_ours, state_theirs, rtol=1e-4, atol=1e-6, what=f"state, chunk {step}")

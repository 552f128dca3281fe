"""Embedders: the local MiniLM int8 ONNX model and an OpenAI-compatible endpoint (local server)."""

from __future__ import annotations

import numpy as np
import pytest

from memory.services.embedding import (
    EmbedderError,
    EmbedderUnavailable,
    MiniLMEmbedder,
    OpenAICompatibleEmbedder,
    embed_query,
    embedder_get,
)
from tests.memory.services.experience_servers import FakeOpenAI, fake_vector


@pytest.fixture(scope="module")
def minilm():
    return MiniLMEmbedder()


def test_minilm_returns_unit_vectors_and_knows_paraphrases(minilm):
    vectors = minilm.embed(
        [
            "my container keeps restarting over and over right after the release",
            "Pod stuck in CrashLoopBackOff after deploy",
            "How do I bake sourdough bread?",
        ]
    )
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2


def test_minilm_pads_per_batch_so_a_text_embeds_alike_alone_or_with_longer_ones(minilm):
    alone = minilm.embed(["short text"])[0]
    batched = minilm.embed(["short text", "a much longer text " * 20])[0]
    assert float(alone @ batched) > 0.9999


def test_minilm_batches_by_length_but_answers_in_the_callers_order():
    # 3 batches of 2; lengths interleaved so sorting by length reorders across batches.
    embedder = MiniLMEmbedder(batch_size=2)
    texts = [f"{'word ' * (n * 7 % 11)}topic {n}" for n in range(6)]
    together = embedder.embed(texts)
    for i, text in enumerate(texts):
        assert float(together[i] @ embedder.embed([text])[0]) > 0.9999, text


def test_the_default_embedder_is_the_local_model(settings):
    assert embedder_get().model_name == "all-MiniLM-L6-v2-onnx-int8"
    model, vector = embed_query("hello")
    assert model == "all-MiniLM-L6-v2-onnx-int8" and vector.shape == (384,)


def test_openai_compatible_endpoint():
    server = FakeOpenAI()
    try:
        embedder = OpenAICompatibleEmbedder(url=server.url, model="m")
        vectors = embedder.embed(["a b", "c"])
        assert np.allclose(vectors[0], fake_vector("a b"), atol=1e-6)
        assert server.embed_requests == [["a b", "c"]]
        server.mode = "fail"
        with pytest.raises(EmbedderUnavailable, match="HTTP 500"):
            embedder.embed(["x"])
    finally:
        server.close()


def test_unreachable_endpoint_is_transient_and_a_bad_answer_permanent():
    with pytest.raises(EmbedderUnavailable):
        OpenAICompatibleEmbedder(url="http://127.0.0.1:9", model="m", timeout=2).embed(["x"])
    server = FakeOpenAI()
    try:
        # 384 dimensions are required: a mismatch is a permanent error, not retried.
        embedder = OpenAICompatibleEmbedder(url=server.url, model="m")
        embedder.dimensions = 512
        with pytest.raises(EmbedderError, match="shape") as info:
            embedder.embed(["x"])
        assert not isinstance(info.value, EmbedderUnavailable)
    finally:
        server.close()

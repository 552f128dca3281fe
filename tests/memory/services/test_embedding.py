"""Embedders: the local MiniLM int8 ONNX model and an OpenAI-compatible endpoint (local server)."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from memory.services.embedding import (
    EmbedderError,
    EmbedderUnavailable,
    MiniLMEmbedder,
    OpenAICompatibleEmbedder,
    embed_query,
    embedder_get,
    retry_after_seconds,
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
        embedder = OpenAICompatibleEmbedder(url=server.url, model="m", backoff=0.01)
        vectors = embedder.embed(["a b", "c"])
        assert np.allclose(vectors[0], fake_vector("a b"), atol=1e-6)
        assert server.embed_requests == [["a b", "c"]]
        server.mode = "fail"
        with pytest.raises(EmbedderUnavailable, match="HTTP 500"):
            embedder.embed(["x"])
        assert server.embed_requests[1:] == [["x"]] * 4  # the first try and three retries
    finally:
        server.close()


def test_unreachable_endpoint_is_transient_and_a_bad_answer_permanent():
    with pytest.raises(EmbedderUnavailable):
        OpenAICompatibleEmbedder(url="http://127.0.0.1:9", model="m", timeout=2, backoff=0.01).embed(["x"])
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


@pytest.fixture
def remote() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI()
    try:
        yield server
    finally:
        server.close()


def test_the_endpoint_gets_at_most_64_texts_per_call(remote: FakeOpenAI) -> None:
    texts = [f"text number {i}" for i in range(130)]
    vectors = OpenAICompatibleEmbedder(url=remote.url, model="m", batch_size=500).embed(texts)
    assert [len(batch) for batch in remote.embed_requests] == [64, 64, 2]
    assert remote.texts_embedded() == texts
    assert np.allclose(vectors[129], fake_vector("text number 129"), atol=1e-6)


def test_overload_and_rate_limits_are_retried_honouring_retry_after(remote: FakeOpenAI) -> None:
    texts = [f"t{i}" for i in range(70)]
    remote.fail_next = [(503, {}), (429, {"Retry-After": "1"})]
    started = time.monotonic()
    vectors = OpenAICompatibleEmbedder(url=remote.url, model="m", backoff=0.01).embed(texts)
    assert time.monotonic() - started >= 1.0  # the server asked for a second
    # The first batch three times (two refusals), the second once: nothing embedded twice.
    assert [len(batch) for batch in remote.embed_requests] == [64, 64, 64, 6]
    assert vectors.shape == (70, 384) and np.allclose(vectors[69], fake_vector("t69"), atol=1e-6)


def test_a_timeout_is_retried(remote: FakeOpenAI) -> None:
    remote.stall_next = [3.0]
    vectors = OpenAICompatibleEmbedder(url=remote.url, model="m", timeout=0.5, backoff=0.01).embed(["late"])
    assert remote.embed_requests == [["late"], ["late"]]
    assert np.allclose(vectors[0], fake_vector("late"), atol=1e-6)


def test_a_long_retry_after_is_left_to_the_job_retry(remote: FakeOpenAI) -> None:
    remote.fail_next = [(429, {"Retry-After": "120"})]
    with pytest.raises(EmbedderUnavailable, match="HTTP 429"):
        OpenAICompatibleEmbedder(url=remote.url, model="m", backoff=0.01).embed(["x"])
    assert remote.embed_requests == [["x"]]


def test_a_client_error_is_permanent_and_not_retried(remote: FakeOpenAI) -> None:
    remote.fail_next = [(400, {})]
    with pytest.raises(EmbedderError, match="HTTP 400") as info:
        OpenAICompatibleEmbedder(url=remote.url, model="m", backoff=0.01).embed(["x"])
    assert not isinstance(info.value, EmbedderUnavailable)
    assert remote.embed_requests == [["x"]]


def test_retry_after_is_read_as_seconds_or_an_http_date() -> None:
    assert retry_after_seconds("7") == 7.0
    later = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 <= (retry_after_seconds(later) or 0) <= 31
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None

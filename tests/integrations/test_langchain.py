"""CtxappChatMessageHistory and CtxappRetriever with the real langchain-core, against a live server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    ChatMessageChunk,
    FunctionMessage,
    FunctionMessageChunk,
    HumanMessage,
    HumanMessageChunk,
    RemoveMessage,
    SystemMessage,
    SystemMessageChunk,
    ToolMessage,
    ToolMessageChunk,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory

from ctxapp.client import AsyncClient, Client, NotFound
from ctxapp.integrations.langchain import CtxappChatMessageHistory, CtxappRetriever
from memory.models import Message, Session, SessionStatus

CONVERSATION = [
    SystemMessage("You track parcels."),
    HumanMessage("Where is parcel 991?", id="h1", name="dana"),
    AIMessage(
        "", tool_calls=[{"id": "call_1", "name": "track", "args": {"parcel": 991}, "type": "tool_call"}]
    ),
    ToolMessage("In Lyon, out for delivery.", tool_call_id="call_1"),
    AIMessage([{"type": "text", "text": "It is out for delivery in Lyon."}]),
    ChatMessage("note for the operator", role="operator"),
]


def _plain(messages: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (
            type(m).__name__,
            m.content,
            getattr(m, "tool_call_id", None),
            getattr(m, "role", None),
            m.id,
            m.name,
        )
        for m in messages
    ]


def test_a_history_round_trips_every_message_type_in_one_batch(server: str, alice_key: str) -> None:
    history = CtxappChatMessageHistory(Client(server, alice_key), agent="parcel-bot", user_id="dana")
    history.add_messages(CONVERSATION)

    again = CtxappChatMessageHistory(Client(server, alice_key), session_id=history.session_id)
    loaded = again.messages
    assert _plain(loaded) == _plain(CONVERSATION)
    assert loaded[2].tool_calls == [
        {"id": "call_1", "name": "track", "args": {"parcel": 991}, "type": "tool_call"}
    ]

    session = Session.objects.get(public_id=history.session_id)
    assert (session.agent.external_id, session.user_id) == ("parcel-bot", "dana")
    rows = list(Message.objects.filter(session=session).order_by("seq"))
    assert [m.role for m in rows] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert rows[2].tool_calls[0]["function"] == {"name": "track", "arguments": '{"parcel": 991}'}
    assert rows[3].tool_call_id == "call_1"
    assert len({m.created_at for m in rows}) == 1  # one batch append: one write


# One of every message class of langchain-core, chunks included, each with the fields it can carry.
EVERY_CLASS: list[BaseMessage] = [
    SystemMessage("You track parcels.", id="sys-1", additional_kwargs={"cache": "ephemeral"}),
    HumanMessage([{"type": "text", "text": "Where is 991?"}], id="h-1", name="dana"),
    AIMessage(
        "Checking.",
        id="run-1",
        tool_calls=[
            {"id": None, "name": "track", "args": {"parcel": 991}, "type": "tool_call"},
            {"id": "call_2", "name": "eta", "args": {"city": "Lyon", "days": [1, 2]}, "type": "tool_call"},
        ],
        invalid_tool_calls=[
            {
                "id": "call_3",
                "name": "refund",
                "args": "{oops",
                "error": "bad JSON",
                "type": "invalid_tool_call",
            }
        ],
        additional_kwargs={"refusal": None, "reasoning": {"summary": ["look it up"]}},
        response_metadata={"model_name": "gpt-4o", "finish_reason": "tool_calls", "logprobs": None},
        usage_metadata={
            "input_tokens": 31,
            "output_tokens": 12,
            "total_tokens": 43,
            "input_token_details": {"cache_read": 8},
        },
    ),
    ToolMessage("In Lyon.", tool_call_id="call_2", artifact={"rows": [{"city": "Lyon"}]}, status="error"),
    ToolMessage([{"type": "text", "text": "ok"}], tool_call_id="call_2", name="eta", id="t-2"),
    AIMessageChunk(
        "It is ",
        id="run-2",
        tool_call_chunks=[{"name": "track", "args": '{"parcel": 9', "id": None, "index": 0}],
        usage_metadata={"input_tokens": 5, "output_tokens": 1, "total_tokens": 6},
        response_metadata={"model_provider": "openai"},
    ),
    AIMessageChunk("in Lyon.", chunk_position="last"),
    HumanMessageChunk("and 992?", name="dana"),
    SystemMessageChunk("Be brief."),
    ToolMessageChunk("pending", tool_call_id="call_2", artifact=[1, 2], status="success"),
    FunctionMessage("42", name="answer"),
    FunctionMessageChunk("43", name="answer", id="f-2"),
    ChatMessage("note for the operator", role="operator"),
    ChatMessage("a reply under a ctxapp role", role="assistant"),
    ChatMessageChunk("critique", role="critic"),
]


@pytest.mark.filterwarnings("ignore:The class `InMemoryChatMessageHistory` was deprecated")
def test_every_message_class_comes_back_as_the_in_memory_history_keeps_it(
    server: str, alice_key: str
) -> None:
    reference = InMemoryChatMessageHistory()
    reference.add_messages(EVERY_CLASS)
    history = CtxappChatMessageHistory(Client(server, alice_key), agent="parcel-bot")
    history.add_messages(EVERY_CLASS)

    loaded = CtxappChatMessageHistory(Client(server, alice_key), session_id=history.session_id).messages
    assert [type(m) for m in loaded] == [type(m) for m in reference.messages]
    for mine, theirs in zip(loaded, reference.messages, strict=True):
        assert mine.model_dump() == theirs.model_dump(), type(theirs).__name__
    assert loaded == reference.messages
    assert loaded[2].tool_calls[0]["id"] is None  # not a made-up id

    rows = list(Message.objects.filter(session__public_id=history.session_id).order_by("seq"))
    assert [m.role for m in rows] == [
        "system", "user", "assistant", "tool", "tool", "assistant", "assistant", "user", "system", "tool",
        "tool", "tool", "user", "assistant", "user",
    ]  # fmt: skip
    assert rows[2].tool_calls[1]["id"] == "call_2" and rows[2].tool_calls[0]["id"]  # ctxapp pairs by id
    assert (rows[1].name, rows[10].tool_call_id) == ("dana", "answer")


def test_a_remove_message_is_refused_not_stored(server: str, alice_key: str) -> None:
    history = CtxappChatMessageHistory(Client(server, alice_key), agent="parcel-bot")
    with pytest.raises(ValueError, match="RemoveMessage"):
        history.add_messages([HumanMessage("hello"), RemoveMessage(id="h-1")])
    assert history.session_id is None or not Message.objects.filter(session__public_id=history.session_id)


@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")
@pytest.mark.filterwarnings("ignore:The class `InMemoryChatMessageHistory` was deprecated")
def test_a_streamed_reply_is_recorded_as_the_ai_turn(server: str, alice_key: str) -> None:
    def chain_with(history: Any) -> RunnableWithMessageHistory:
        model = GenericFakeChatModel(messages=iter([AIMessage("Hello Dana, how can I help?", id="r-1")]))
        prompt = ChatPromptTemplate.from_messages([MessagesPlaceholder("history"), ("human", "{question}")])
        return RunnableWithMessageHistory(
            prompt | model, lambda _: history, input_messages_key="question", history_messages_key="history"
        )

    reference = InMemoryChatMessageHistory()
    ours = CtxappChatMessageHistory(Client(server, alice_key), agent="greeter")
    config = {"configurable": {"session_id": "dana"}}
    for history in (reference, ours):
        streamed = list(chain_with(history).stream({"question": "I am Dana."}, config))
        assert "".join(str(chunk.content) for chunk in streamed) == "Hello Dana, how can I help?"

    assert ours.messages == reference.messages
    assert isinstance(ours.messages[1], AIMessageChunk)
    session = Session.objects.get(public_id=ours.session_id)
    assert [(m.role, m.content) for m in Message.objects.filter(session=session).order_by("seq")] == [
        ("user", "I am Dana."),
        ("assistant", "Hello Dana, how can I help?"),
    ]


def test_clear_ends_the_session_and_continues_in_a_new_one(server: str, alice_key: str) -> None:
    history = CtxappChatMessageHistory(Client(server, alice_key), agent="parcel-bot", user_id="dana")
    history.add_messages(CONVERSATION[:2])
    first = history.session_id
    history.clear()
    assert history.messages == []
    assert Session.objects.get(public_id=first).status == SessionStatus.ENDED
    assert Message.objects.filter(session__public_id=first).count() == 2  # kept for the record
    history.add_user_message("A new question")
    assert history.session_id != first
    second = Session.objects.get(public_id=history.session_id)
    assert (second.agent.external_id, second.user_id) == ("parcel-bot", "dana")
    assert [m.content for m in history.messages] == ["A new question"]

    deleting = CtxappChatMessageHistory(Client(server, alice_key), agent="parcel-bot", clear_mode="delete")
    deleting.add_messages(CONVERSATION[:1])
    gone = deleting.session_id
    deleting.clear()
    assert not Session.objects.filter(public_id=gone).exists()


def test_a_history_named_by_the_apps_own_id_finds_its_session_again(server: str, alice_key: str) -> None:
    history = CtxappChatMessageHistory(Client(server, alice_key), session_id="conv-r1")
    assert history.messages == []  # opened on first use
    history.add_messages(CONVERSATION[:2])
    again = CtxappChatMessageHistory(Client(server, alice_key), session_id="conv-r1")
    assert _plain(again.messages) == _plain(CONVERSATION[:2])
    assert again.session_id == history.session_id
    session = Session.objects.get(public_id=history.session_id)
    assert (session.agent.external_id, session.key) == ("langchain", "conv-r1")
    other_agent = CtxappChatMessageHistory(
        Client(server, alice_key), session_id="conv-r1", agent="parcel-bot"
    )
    assert other_agent.messages == []  # a key is unique per agent

    again.clear()  # the key names one session: clearing deletes it, and the key starts over
    assert not Session.objects.filter(public_id=session.public_id).exists()
    again.add_user_message("A new question")
    fresh = CtxappChatMessageHistory(Client(server, alice_key), session_id="conv-r1")
    assert [m.content for m in fresh.messages] == ["A new question"]
    with pytest.raises(ValueError, match="clear_mode"):
        CtxappChatMessageHistory(Client(server, alice_key), session_id="conv-r1", clear_mode="end")


def test_the_async_history(server: str, alice_key: str) -> None:
    async def run() -> tuple[list[Any], str | None]:
        async with AsyncClient(server, alice_key) as client:
            history = CtxappChatMessageHistory(async_client=client, agent="parcel-bot")
            await history.aadd_messages(CONVERSATION)
            loaded = await history.aget_messages()
            session_id = history.session_id
            await history.aclear()
            return loaded, session_id

    loaded, session_id = asyncio.run(run())
    assert _plain(loaded) == _plain(CONVERSATION)
    assert Session.objects.get(public_id=session_id).status == SessionStatus.ENDED


def test_another_tenant_cannot_read_or_write_the_history(server: str, alice_key: str, bob_key: str) -> None:
    alice = CtxappChatMessageHistory(Client(server, alice_key, retries=0), agent="parcel-bot")
    alice.add_messages(CONVERSATION[:2])
    bob = CtxappChatMessageHistory(Client(server, bob_key, retries=0), session_id=alice.session_id)
    with pytest.raises(NotFound):
        _ = bob.messages
    with pytest.raises(NotFound):
        bob.add_messages([HumanMessage("let me in")])
    assert Message.objects.filter(session__public_id=alice.session_id).count() == 2


# Still the documented way to give a LangChain chain a message history; LangChain points new code at
# LangGraph persistence, which tests/integrations/test_langgraph.py covers.
@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")
def test_a_chain_with_message_history_remembers_through_ctxapp(server: str, alice_key: str) -> None:
    model = GenericFakeChatModel(messages=iter([AIMessage("Hello Dana."), AIMessage("Your name is Dana.")]))
    prompt = ChatPromptTemplate.from_messages([MessagesPlaceholder("history"), ("human", "{question}")])
    histories: dict[str, CtxappChatMessageHistory] = {}

    def history_for(session_key: str) -> CtxappChatMessageHistory:
        if session_key not in histories:
            histories[session_key] = CtxappChatMessageHistory(Client(server, alice_key), agent="greeter")
        return histories[session_key]

    chain = RunnableWithMessageHistory(
        prompt | model, history_for, input_messages_key="question", history_messages_key="history"
    )
    config = {"configurable": {"session_id": "dana"}}
    chain.invoke({"question": "I am Dana."}, config)
    chain.invoke({"question": "What is my name?"}, config)
    session = Session.objects.get(public_id=histories["dana"].session_id)
    assert [(m.role, m.content) for m in Message.objects.filter(session=session).order_by("seq")] == [
        ("user", "I am Dana."),
        ("assistant", "Hello Dana."),
        ("user", "What is my name?"),
        ("assistant", "Your name is Dana."),
    ]


def test_the_retriever_finds_experiences_and_only_the_callers(
    server: str, alice_key: str, bob_key: str
) -> None:
    alice = Client(server, alice_key)
    alice.experience_create(
        "Parcel stuck at customs for more than 3 days",
        solution="Ask the customer for the commercial invoice.",
    )
    alice.experience_create("Printer out of toner", solution="Order cartridge TN-2420.")
    retriever = CtxappRetriever(client=alice, k=2)
    docs = retriever.invoke("parcel held at customs")
    assert docs, "the text signal finds it even before the embedding job ran"
    assert "commercial invoice" in docs[0].page_content
    assert docs[0].metadata["kind"] == "experience"
    assert isinstance(docs[0].metadata["score"], float) and "lexical" in docs[0].metadata["contributions"]

    async def arun() -> list[Any]:
        async with AsyncClient(server, alice_key) as client:
            return await CtxappRetriever(async_client=client, k=2).ainvoke("parcel held at customs")

    assert [d.metadata["id"] for d in asyncio.run(arun())][:1] == [docs[0].metadata["id"]]
    assert CtxappRetriever(client=Client(server, bob_key), k=2).invoke("parcel held at customs") == []


def test_the_retriever_recalls_a_turn_from_an_earlier_session_within_its_scope(
    server: str, alice_key: str, bob_key: str
) -> None:
    first = CtxappChatMessageHistory(Client(server, alice_key), agent="parcel-bot", user_id="dana")
    first.add_messages(
        [HumanMessage("Hello!"), HumanMessage("My parcel 4471 is stuck at customs in Rotterdam."),
         AIMessage("I will ask the carrier.")]
    )  # fmt: skip
    other_user = CtxappChatMessageHistory(Client(server, alice_key), agent="parcel-bot", user_id="eve")
    other_user.add_messages([HumanMessage("My parcel 8812 is stuck at customs in Hamburg.")])
    later = CtxappChatMessageHistory(Client(server, alice_key), agent="parcel-bot", user_id="dana")
    later.add_messages([HumanMessage("Any news?")])

    alice = Client(server, alice_key)
    query = "where is my parcel stuck at customs"
    retriever = CtxappRetriever(client=alice, k=3, session=later.session_id, kinds=["message"], neighbours=1)
    docs = retriever.invoke(query)
    assert docs and "Rotterdam" in docs[0].page_content  # said in the earlier session
    assert docs[0].metadata["kind"] == "message"
    assert docs[0].metadata["session"] == first.session_id and docs[0].metadata["seq"] == 2
    assert docs[0].metadata["id"] == f"{first.session_id}:2"
    assert [n["seq"] for n in docs[0].metadata["neighbours"]] == [1, 3]
    assert not any("Hamburg" in d.page_content for d in docs)  # another user's session: out of scope

    current = CtxappRetriever(client=alice, k=5, session=later.session_id, sessions="current").invoke(query)
    assert not any("Rotterdam" in d.page_content for d in current)
    eve = CtxappRetriever(client=alice, k=5, user_id="eve", kinds=["message"]).invoke(query)
    assert [d.page_content for d in eve] == ["My parcel 8812 is stuck at customs in Hamburg."]
    whole_tenant = CtxappRetriever(client=alice, k=5, kinds=["message"]).invoke(query)
    assert {"Rotterdam", "Hamburg"} <= {w.strip(".") for d in whole_tenant for w in d.page_content.split()}

    async def arun() -> list[Any]:
        async with AsyncClient(server, alice_key) as client:
            return await CtxappRetriever(
                async_client=client, k=3, session=later.session_id, kinds=["message"]
            ).ainvoke(query)

    assert [d.metadata["id"] for d in asyncio.run(arun())][:1] == [docs[0].metadata["id"]]
    with pytest.raises(NotFound):  # another tenant's session answers 404 like a missing one
        CtxappRetriever(client=Client(server, bob_key), session=later.session_id).invoke(query)
    assert CtxappRetriever(client=Client(server, bob_key), k=5).invoke(query) == []

"""EngrainStore: LangGraph's BaseStore on skill memory (real local embeddings), on both backends."""

from __future__ import annotations

import asyncio
from typing import TypedDict

import pytest

pytest.importorskip("langgraph.store.base")

from langgraph.graph import START, StateGraph  # noqa: E402
from langgraph.store.base import BaseStore, InvalidNamespaceError  # noqa: E402

import engrain as eg  # noqa: E402
from engrain.integrations.langgraph import EngrainCheckpointer, EngrainStore  # noqa: E402


@pytest.fixture
def store(store_url, embedder):
    s = EngrainStore(memory=eg.Memory(store_url, embedder=embedder))
    yield s
    s.memory.close()


def test_put_get_update_delete(store):
    assert isinstance(store, BaseStore)
    store.put(("users", "ann"), "food", {"likes": "spicy ramen"})
    item = store.get(("users", "ann"), "food")
    assert item.value == {"likes": "spicy ramen"} and item.key == "food" and item.namespace == ("users", "ann")
    first = item.created_at
    store.put(("users", "ann"), "food", {"likes": "sushi"})
    again = store.get(("users", "ann"), "food")
    assert again.value == {"likes": "sushi"} and again.created_at == first and again.updated_at >= first
    # Same key in another namespace, same value under another key: separate items.
    store.put(("users", "bob"), "food", {"likes": "sushi"})
    store.put(("users", "ann"), "lunch", {"likes": "sushi"})
    assert store.get(("users", "bob"), "food").value == {"likes": "sushi"}
    assert store.get(("users",), "food") is None  # a prefix is not the namespace
    store.delete(("users", "ann"), "food")
    assert store.get(("users", "ann"), "food") is None and store.get(("users", "ann"), "lunch") is not None
    with pytest.raises(InvalidNamespaceError):
        store.put((), "k", {"v": 1})


def test_search_by_meaning_with_prefix_and_filters(store):
    store.put(("users", "ann"), "food", {"likes": "spicy ramen and dumplings", "score": 5})
    store.put(("users", "ann"), "pet", {"likes": "her cat called Miso", "score": 2})
    store.put(("users", "bob"), "food", {"likes": "plain white rice", "score": 3})
    store.put(("docs",), "readme", {"text": "how to deploy the service", "score": 9})
    hits = store.search(("users", "ann"), query="what food does she enjoy eating?")
    assert [h.key for h in hits] == ["food", "pet"] and hits[0].score > hits[1].score
    assert all(h.namespace == ("users", "ann") for h in hits)
    # A namespace prefix reaches every namespace below it; value filters with operators.
    assert sorted(h.namespace[1] for h in store.search(("users",), filter={"score": {"$gte": 3}})) == ["ann", "bob"]
    assert [h.key for h in store.search(("users",), filter={"score": 2})] == ["pet"]
    assert [h.key for h in store.search((), query="deploying")][:1] == ["readme"]
    assert len(store.search(("users",), limit=2)) == 2 and len(store.search(("users",), limit=2, offset=2)) == 1


def test_list_namespaces(store):
    for ns in [("users", "ann"), ("users", "bob"), ("docs", "v1"), ("cache", "a", "v1")]:
        store.put(ns, "k", {"x": 1})
    assert store.list_namespaces() == [("cache", "a", "v1"), ("docs", "v1"), ("users", "ann"), ("users", "bob")]
    assert store.list_namespaces(prefix=("users",)) == [("users", "ann"), ("users", "bob")]
    assert store.list_namespaces(suffix=("v1",)) == [("cache", "a", "v1"), ("docs", "v1")]
    assert store.list_namespaces(max_depth=1) == [("cache",), ("docs",), ("users",)]
    assert store.list_namespaces(limit=1, offset=1) == [("docs", "v1")]


def test_async_api(store):
    async def go():
        await store.aput(("a",), "k", {"v": "async value"})
        return await store.aget(("a",), "k")

    assert asyncio.run(go()).value == {"v": "async value"}


class S(TypedDict):
    user: str
    answer: str


def test_a_graph_reads_long_term_memory_from_the_store(store, store_url):
    store.put(("memories", "ann"), "diet", {"text": "Ann is vegetarian"})

    def respond(state: S, *, store: BaseStore) -> dict:
        hits = store.search(("memories", state["user"]), query="what does the user eat?", limit=1)
        return {"answer": hits[0].value["text"] if hits else "nothing known"}

    b = StateGraph(S)
    b.add_node("respond", respond)
    b.add_edge(START, "respond")
    graph = b.compile(checkpointer=EngrainCheckpointer(store_url), store=store)
    out = graph.invoke({"user": "ann", "answer": ""}, {"configurable": {"thread_id": "mem-1"}})
    assert out["answer"] == "Ann is vegetarian"
    # The items are ordinary engrain memory: recall sees them too.
    assert any("vegetarian" in h.content for h in store.memory.recall("vegetarian", skill="langgraph"))

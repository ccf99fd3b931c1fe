"""The catalog of warm prompts: bounded per tenant, tenants apart, shared prompts seen by all."""

from __future__ import annotations

import pytest

from gateway.speech_cache.catalog import Catalog, CatalogFull
from gateway.speech_cache.prompts import SHARED_TENANT, PromptSpec


def spec(text: str, voice: str = "en-us") -> PromptSpec:
    return PromptSpec(text=text, voice=voice)


def test_the_same_prompt_is_one_entry() -> None:
    catalog = Catalog(max_per_tenant=2)
    first, new = catalog.add("acme", spec("Hello."), "api")
    again, new_again = catalog.add("acme", spec("Hello."), "api")
    assert (new, new_again, again is first) == (True, False, True)
    assert catalog.count("acme") == 1


def test_a_tenant_holds_at_most_its_limit_and_the_worker_its_total() -> None:
    catalog = Catalog(max_per_tenant=2, max_total=3)
    catalog.add("acme", spec("a"), "api")
    catalog.add("acme", spec("b"), "api")
    with pytest.raises(CatalogFull):
        catalog.add("acme", spec("c"), "api")
    catalog.add("acme", spec("a"), "api")  # one it holds: no new entry needed
    catalog.add("other", spec("a"), "api")
    with pytest.raises(CatalogFull):
        catalog.add("third", spec("a"), "api")
    assert catalog.remove("acme", spec("a").prompt_id("acme"))
    catalog.add("third", spec("a"), "api")
    assert catalog.count() == 3


def test_tenants_see_their_own_and_the_shared_prompts_only() -> None:
    catalog = Catalog()
    mine, _ = catalog.add("acme", spec("mine"), "api")
    theirs, _ = catalog.add("other", spec("theirs"), "api")
    shared, _ = catalog.add(SHARED_TENANT, spec("Welcome."), "file:1")
    assert [e.id for e in catalog.visible("acme")] == [mine.id, shared.id]
    assert catalog.get("acme", theirs.id) is None
    assert catalog.get("acme", shared.id) is shared
    assert not catalog.remove("acme", theirs.id)
    assert not catalog.remove("acme", shared.id)  # the operator's
    assert shared.to_json()["shared"] is True and mine.to_json()["shared"] is False


def test_a_deleted_voice_takes_its_prompts_along() -> None:
    catalog = Catalog()
    catalog.add("acme", spec("one", "vc_0123456789abcdef"), "api")
    catalog.add("acme", spec("two", "vc_0123456789abcdef"), "api")
    kept, _ = catalog.add("acme", spec("three"), "api")
    assert catalog.remove_voice("vc_0123456789abcdef") == 2
    assert [e.id for e in catalog.visible("acme")] == [kept.id]
    assert catalog.count() == 1
    assert catalog.by_state() == {"pending": 1, "warming": 0, "warm": 0, "failed": 0}

"""Whose session it is and under what limit: one function for every entry point."""

from __future__ import annotations

import ast
from pathlib import Path

from gateway.auth import Principal
from gateway.tenant_quota import UNASSIGNED, TenantQuota, quota_for

GATEWAY = Path(__file__).resolve().parents[2] / "gateway"


def principal(max_streams: int | None) -> Principal:
    return Principal("alice", "acme", frozenset({"tts:stream"}), max_streams, 0.0)


def test_a_token_gives_its_tenant_and_its_claim() -> None:
    assert quota_for(principal(2)) == TenantQuota("acme", 2)
    assert quota_for(principal(2)).limit(100) == 2
    assert quota_for(principal(None)).limit(100) == 100  # GATEWAY_TENANT_MAX_STREAMS


def test_the_tenants_retention_is_a_ceiling() -> None:
    """The token's ``cache: false`` or GATEWAY_SPEECH_CACHE_NO_RETENTION keeps nothing,
    whatever a request asks; otherwise the request decides, by default keeping."""
    free = quota_for(principal(None))
    assert free.retains(frozenset()) and free.retains(frozenset(), True)
    assert not free.retains(frozenset(), False)
    assert not free.retains(frozenset({"acme"}), True)
    assert not free.retains(frozenset({"*"}), None)
    assert free.retains(frozenset({"other"}), None)
    claimed = quota_for(Principal("alice", "acme", frozenset(), None, 0.0, cache=False))
    assert claimed == TenantQuota("acme", None, False)
    assert not claimed.retains(frozenset(), True)


def test_a_trusted_network_gives_its_tenant_under_the_setting() -> None:
    assert quota_for("audiosocket") == TenantQuota("audiosocket", None)
    assert quota_for("sip").limit(7) == 7


def _quota_argument_ok(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "UNASSIGNED"
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "quota_for"
    )


def test_every_entry_point_gets_its_quota_from_quota_for() -> None:
    """Every session the gateway makes (``new_session``) and every later assignment of a
    session's quota goes through :func:`quota_for` (or starts ``UNASSIGNED``, for a
    connection that authenticates after the upgrade): no entry point can set a tenant
    and forget its limit, as the speech endpoint once did."""
    sessions = assignments = 0
    for path in GATEWAY.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "new_session"
            ):
                sessions += 1
                quota = node.args[2] if len(node.args) > 2 else None
                quota = quota or next((k.value for k in node.keywords if k.arg == "quota"), None)
                assert quota is not None and _quota_argument_ok(quota), (path, node.lineno)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and target.attr in (
                        "quota",
                        "tenant",
                        "max_streams",
                    ):
                        value_ok = _quota_argument_ok(node.value) or path.name == "session.py"
                        if target.attr == "quota":
                            assignments += 1
                            assert value_ok, (path, node.lineno)
                        else:  # a leg's own record of its tenant, never the session's
                            owner = target.value
                            name = owner.attr if isinstance(owner, ast.Attribute) else ""
                            name = owner.id if isinstance(owner, ast.Name) else name
                            assert name != "session", (path, node.lineno)
    # base connections, speech, AudioSocket, SIP; the base's authentication
    assert sessions >= 4 and assignments >= 1
    assert UNASSIGNED.tenant == ""

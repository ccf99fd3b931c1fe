"""What the speech cache may keep of a segment (docs/speech-cache.md, "What may be kept").

A segment is stored only if it may be:

- nothing of an utterance whose request said ``cache: false`` (or whose tenant keeps
  nothing: the gateway sends that as the stream's default), declared or not;
- a declared segment (a prompt the operator or a tenant asked to keep warm) whole, even
  when it carries personal data: declared text is not a caller's data;
- any other segment unless it carries personal data (engine.normalize.personal: the
  splitter marks it; the words before the item are a segment of their own and kept).
"""

from __future__ import annotations


def may_keep(*, retain: bool, declared: bool, personal: bool) -> bool:
    """Whether a synthesized segment may be stored in the speech cache."""
    if not retain:
        return False
    return declared or not personal

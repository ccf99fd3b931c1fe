"""Telephony media: G.711, Opus, Ogg, resampling. Nothing here knows about HTTP."""

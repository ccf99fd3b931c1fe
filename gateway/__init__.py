"""The aiohttp gateway: auth, sessions, wire protocols, pacing, metrics."""

"""The speech cache on the gateway's side (docs/speech-cache.md): warm prompts from a
file, from the SIP flows and from the API, what the engine holds of them, and the
forgetting of deleted voices. The cache itself is the engine's (``engine/speech_cache``)."""

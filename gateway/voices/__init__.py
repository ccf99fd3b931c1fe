"""Registered voices, one feature in one package:

- :mod:`.api`: the ``/v1/voices`` HTTP endpoints (auth, multipart, limits, error codes);
- :mod:`.reference_audio`: uploaded bytes to normalized reference audio (sans-I/O);
- :mod:`.upload_worker`: runs that in worker processes, never in the gateway's own;
- :mod:`.registry`: voices and their features, cached in memory then in the store;
- :mod:`.store`: where records, reference audio and features live (Redis or a directory).
"""

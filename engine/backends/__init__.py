"""TTS backends behind one interface; see :mod:`engine.backends.base`."""

"""The TTS engine process, its backends, and the IPC contract the gateway talks to."""

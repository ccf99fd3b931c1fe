"""Audio codecs, independent of any vendor protocol: G.711 (:mod:`.g711`), Opus
(:mod:`.opus`) and streaming resampling (:mod:`.resample`), and the one table of formats
and rates (:mod:`.formats`). The gateway encodes frames
with them, the engine resamples with them; the vendor protocol cores beside this package
(``telephony/twilio.py``, ``telephony/asterisk.py``) carry their bytes."""

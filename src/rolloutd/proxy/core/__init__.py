"""The bottom of the gateway's layers, used by every other: the internal request and response
of a model call (:mod:`.call_types`) and the JSON codec (:mod:`.fastjson`)."""

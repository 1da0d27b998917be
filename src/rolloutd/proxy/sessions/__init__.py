"""Gateway sessions: their durable state, open and close, the calls in flight, request
identity, liveness, failed calls, the recorder that appends completions, and replay across
attempts."""

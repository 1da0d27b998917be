"""One model call from the translated request to the recorded answer: the call service
(``tokens`` capture), passthrough calls, sampling parameters."""

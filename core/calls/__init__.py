"""What the recording proxy writes about each model call (``model_calls.jsonl``) and how a call is
classified: the vocabulary shared by the proxy, the run directory, the transcript and token sums."""

"""Gateway library: what a Responses-API server links to talk to ratchet.

- ``events``: builders turning Responses-style item dicts into ``TurnCompleted`` /
  ``ToolEffect`` / ``TurnCancelled`` with canonical content, digests and fingerprint;
- ``producer``: an idempotent Kafka producer (acks=all) whose delivery errors are
  raised, typed, on ``flush``;
- ``client``: the rehydration client returning typed outcomes, never raw dicts;
- ``claims``: claim before execute (``EffectClaims``, a context manager);
- ``errors``: the library's refusals and failures are ``GatewayError``s saying whether a
  retry helps (docs/service.md, section 3, lists them).
"""

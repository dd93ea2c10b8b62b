"""``ratchet chaos``: a seeded, randomized fault run checked by an independent oracle.

- ``workload``: stories (conversations, response chains, undecodable records) from a seed;
- ``produce``: producer processes sending them through the gateway library and as raw bytes;
- ``faults``: worker kills, a zombie worker, server restarts and pauses, on a schedule;
- ``observe``: reads the public surfaces only (output topics, HTTP API);
- ``oracle``: the expected outcome of each event from the CONTRACT rules, on its own;
- ``checker``: compares what was observed with the oracle and lists violations;
- ``report``: JSON report, one-screen summary, PNG plot; ``runner`` ties them together.

Only stable public surfaces are used: the gateway library, ``schemas``, the settings,
``infra`` (launcher) and the ``ratchet`` command line as subprocesses. Nothing here reads
the store or imports the domain's decision code: the oracle must be able to disagree.
"""

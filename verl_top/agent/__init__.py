"""The node agent: a package that runs on every node with only ``python3`` (>= 3.8) there.

Standard library only (pynvml and psutil are used when the node has them); it imports nothing
of the client. Modules: ``main`` (the ``Agent`` and the process loop), ``host`` (/proc host
sampler), ``nvml``/``smi`` (GPU backends), ``procs`` (processes), ``follow`` (log files),
``topo`` (GPU/NIC topology), ``replay`` (a recorded trace for tests and demos), ``backends``
(choosing one), ``wire`` (the record format), ``strides`` (how often each value is read) and
``loader`` (the in-memory importer a node runs it from).

The SSH client ships it as a deflated zip over the session's stdin (``ship.py``, client side,
never shipped itself); ``python -m verl_top.agent`` runs it from a checkout. See
docs/agent.md and docs/protocol.md.
"""

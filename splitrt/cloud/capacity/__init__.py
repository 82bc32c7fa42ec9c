"""What the server can take on: admission and the fair queue (``admission``, ``fairq``), the memory budget
and what a session or a graph is estimated to need (``memory``; a request's activations: ``graph.peak``),
runs ended at their deadline, cancel, limit or over memory (``cancel``, ``runlimit``), runs of a client over
its share at a lower priority (``niced``), and health while saturated (``saturation``)."""

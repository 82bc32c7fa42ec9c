"""The models a server serves: the store and what a model may name (``store``), uploads and their
pace and check (``upload``, ``pace``), tail sessions and the builder of their segments (``tails``,
``builder``), the child processes both checks and builds run in (``children``), and the warm start
(``warm``)."""

"""The models a server serves: the store and what a model may name (``store``), uploads and their
pace and check (``upload``, ``pace``, ``checker``), tail sessions and the child that builds their segments
(``tails``, ``builder``), the warm start (``warm``), and a model's tails exported for other engines
(``v2repo``)."""

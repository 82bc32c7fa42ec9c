"""The models a server serves: the store and what a model may name (``store``), uploads and their
pace and check (``upload``, ``pace``, ``checker``), tail sessions and the child that builds their segments
(``tails``, ``builder``), and the warm start (``warm``)."""

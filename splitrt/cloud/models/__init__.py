"""The models a server serves: ``store``, ``upload`` with ``pace``, ``tails`` with ``builder``, the child
processes of checks and builds (``children``), and ``warm``.
"""

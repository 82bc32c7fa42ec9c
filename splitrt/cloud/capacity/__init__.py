"""What the server can take on: ``admission`` with ``fairq``, ``memory`` (the budget) and ``arena``, runs
ended when they must (``cancel``, ``runlimit``), ``niced`` runs, health while saturated (``saturation``).
"""

"""A model's tails exported for serving engines other than splitrt's own: ``v2repo`` writes a Triton/MLServer
model repository (``splitrt export-repository``)."""

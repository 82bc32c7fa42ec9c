"""The request handler: one request's path from the gRPC method to the tail run and back (``infer``), its
tensors checked and decoded (``inputs``), the next hop on a path of tiers (``nexthop``), and the gRPC
methods that call it (``servicer``)."""

"""The gRPC frontend. Importing it first picks grpcio's I/O path (see :mod:`.transport`)."""

from tritonfast.frontends.grpc.transport import prefer_polled_connections

prefer_polled_connections()
